"""``preflight rollout``: staged rollouts, a launch config changed over nodes in waves."""

import json
import pathlib
import sys
import time

import typer

from . import common
from .common import safe

rollout_app = typer.Typer(
    help="Staged rollouts: a launch config changed over nodes in waves.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

SERVER = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL.")
TOKEN = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A deployer or admin token (auditor: status only).")

# creating a large rollout validates it, and an abort restores its first chunk (up to 256 nodes), in the request
ROLLOUT_TIMEOUT_S = 300
ROLLOUT_MAX_BYTES = 16 << 20  # a rollout of 1,024 nodes with evidence is well under this


def _call(c, method: str, url: str, *, timeout: float, body=None):
    """One rollout request whose whole answer (headers and body, at most ROLLOUT_MAX_BYTES) arrives within
    ``timeout`` seconds — a server that drips bytes is given up on, not waited on — and is a JSON object; exit 1
    (saying so) otherwise, and on a problem answer."""
    import httpx

    from ..agent.client import ResponseTooLarge, read_body

    start = time.monotonic()
    try:
        with c.stream(method, url, json=body, timeout=httpx.Timeout(max(1.0, timeout))) as r:
            raw = read_body(r, url, max_bytes=ROLLOUT_MAX_BYTES, start=start, deadline=max(1.0, timeout))
            full = httpx.Response(r.status_code, headers=r.headers, content=raw, request=r.request)
    except ResponseTooLarge as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(1)
    common.fail_on_problem(full)
    try:
        out = json.loads(raw)
    except (ValueError, RecursionError):
        out = None
    if not isinstance(out, dict):
        typer.echo(f"preflight: {url}: the service's answer is not a JSON object", err=True)
        raise typer.Exit(1)
    return out


def summary(r: dict) -> str:
    """A rollout as lines of text; every value from the service printed escaped and bounded. Raises ValueError for
    an answer that is not a rollout."""
    try:
        return _summary_lines(r)
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the service's answer is not a rollout ({exc.__class__.__name__})") from None


def _summary_lines(r: dict) -> str:
    def num(v) -> str:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else safe(v, 40)

    target = r.get("target")
    if not isinstance(target, dict):
        target = {}
    wave = r.get("wave")
    lines = [
        f"rollout {safe(r['id'], 64)}: {safe(r['state'], 40)}"
        + (f" (wave {wave})" if isinstance(wave, int) and not isinstance(wave, bool) and wave >= 0 else "")
        + (f", {safe(target['manifest'])}" if target.get("manifest") is not None else "")
        + f", failures {num(r.get('failures', 0))} (limit {num(r.get('failure_limit'))})"
        + (f": {safe(r['reason'])}" if r.get("reason") else "")
    ]
    for j in (r.get("judged") or ())[:64]:  # the target's verdict per hardware shape
        rules = [f.get("rule") for f in (j.get("findings") or ())[:64] if isinstance(f, dict)]
        lines.append(
            f"  judged {num(j.get('nodes'))} node(s) of {num(j.get('gpu_count'))} x {safe(j.get('gpu'))}: "
            f"{safe(j.get('verdict'), 40)}" + (f" ({safe(', '.join(map(str, rules)))})" if rules else "")
        )
    for w in (r.get("warnings") or ())[:64]:
        lines.append(f"  warning {safe(w.get('rule'), 64)}: {safe(w.get('message'))}")
    for w in (r.get("waves") or ())[:64]:
        if "index" in w:
            lines.append(
                f"  wave {num(w['index'])}: {num(w.get('percent'))} %, bake {num(w.get('bake_s'))} s, "
                f"{safe(w.get('state'), 40)}, {len(w.get('nodes') or ())} node(s)"
            )
    outcomes = r.get("outcomes")
    if isinstance(outcomes, dict) and outcomes:
        lines.append("  nodes: " + ", ".join(f"{safe(k, 40)} {num(v)}" for k, v in sorted(outcomes.items())[:16]))
    for n in (r.get("nodes") or ())[:2048]:
        evidence = n.get("evidence") if isinstance(n.get("evidence"), dict) else {}
        reason, outcome = evidence.get("reason"), n.get("outcome")
        lines.append(
            f"  {safe(n['node'], 128)}: wave {num(n.get('wave'))}, {safe(outcome, 40)}"
            + (f" ({safe(reason, 64)})" if reason and reason != outcome else "")
            + (
                f" [restore: {safe(evidence['restore'])}]"
                if outcome == "not_restored" and evidence.get("restore")
                else ""
            )
            + (f", seq {num(n['new_seq'])}" if n.get("new_seq") else "")
            + (f", restored at seq {num(n['restored_seq'])}" if n.get("restored_seq") else "")
        )
    return "\n".join(lines)


def _echo(r: dict, as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    try:
        typer.echo(summary(r))
    except ValueError as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(1)


@rollout_app.command("create")
def rollout_create(
    file: pathlib.Path = typer.Argument(..., help="The rollout as JSON (the body of POST /v1/rollouts; - for stdin)."),
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
) -> None:
    """Create a rollout from a JSON file: target (manifest, engine_args, ...), nodes or selector, waves,
    failure_limit, gates. Exit 1 when the service refuses it (the findings are printed)."""
    try:
        body = json.loads(sys.stdin.read() if str(file) == "-" else file.read_text())
    except (OSError, ValueError) as exc:
        typer.echo(f"preflight: {file}: {exc}", err=True)
        raise typer.Exit(2)
    _echo(_call(common.client(server, token), "POST", "/v1/rollouts", body=body, timeout=ROLLOUT_TIMEOUT_S), as_json)


@rollout_app.command("status")
def rollout_status(
    rollout_id: str | None = typer.Argument(None, help="A rollout id (default: list them)."),
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
) -> None:
    """One rollout's state, waves and per-node outcome, or the list of rollouts. With a rollout id, the exit status
    says how it stands, for scripts: 0 completed, 3 halted, rolling back or rolled back, 4 aborted, 5 still going
    (``preflight rollout wait`` waits for the end)."""
    c = common.client(server, token)
    body = _call(c, "GET", f"/v1/rollouts/{rollout_id}" if rollout_id else "/v1/rollouts", timeout=60)
    if as_json:
        typer.echo(json.dumps(body, indent=2))
    elif rollout_id:
        _echo(body)
    else:
        items = body.get("items")
        for item in (items if isinstance(items, list) else [])[:100]:
            _echo(item if isinstance(item, dict) else {})
    if rollout_id:
        raise typer.Exit(_exit_status(body.get("state")))


def _exit_status(state) -> int:
    """0 completed; 3 halted, rolling back or rolled back; 4 aborting or aborted; 5 still going (pending, waiting,
    baking, paused)."""
    if state == "completed":
        return 0
    if state in ("halted", "rolling_back", "rolled_back"):
        return 3
    if state in ("aborting", "aborted"):
        return 4
    return 5


@rollout_app.command("wait")
def rollout_wait(
    rollout_id: str = typer.Argument(..., help="The rollout id."),
    server: str = SERVER,
    token: str = TOKEN,
    timeout: float = typer.Option(3600.0, min=1, help="Give up after this many seconds (exit 5)."),
    interval: float = typer.Option(5.0, min=0.5, help="Seconds between polls."),
) -> None:
    """Wait until the rollout is over or halted, printing each change of state; the exit status is
    ``rollout status``'s (0 completed, 3 halted or rolled back, 4 aborted, 5 still going when the timeout passed)."""
    from ..domain.rollout import FINAL

    over = FINAL + ("halted",)  # what it waits for
    c = common.client(server, token)
    deadline, seen = time.monotonic() + timeout, None
    while True:
        # each poll within what is left of --timeout (at most 60 s): a server that stalls cannot hold the wait open
        body = _call(c, "GET", f"/v1/rollouts/{rollout_id}", timeout=min(60.0, max(1.0, deadline - time.monotonic())))
        state = body.get("state")
        now = (state, body.get("wave"), body.get("failures"))
        if now != seen:
            try:
                typer.echo(summary(body).splitlines()[0])
            except ValueError as exc:
                typer.echo(f"preflight: {exc}", err=True)
                raise typer.Exit(1)
            seen = now
        if state in over or time.monotonic() >= deadline:
            if state not in over:
                typer.echo(f"preflight: still {safe(state, 40)} after {timeout:g} s", err=True)
            raise typer.Exit(_exit_status(state))
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def _verb_command(verb: str, doc: str):
    def run(
        rollout_id: str = typer.Argument(..., help="The rollout id."),
        server: str = SERVER,
        token: str = TOKEN,
        reason: str | None = typer.Option(None, help="Why (recorded in the audit)."),
        as_json: bool = typer.Option(False, "--json", help="Print the response as JSON."),
    ) -> None:
        _echo(
            _call(
                common.client(server, token),
                "POST",
                f"/v1/rollouts/{rollout_id}/{verb}",
                body={"reason": reason} if reason else None,
                timeout=ROLLOUT_TIMEOUT_S,
            ),
            as_json,
        )

    run.__doc__ = doc
    rollout_app.command(verb)(run)


for _verb, _doc in (
    ("pause", "Stop advancing the rollout (failures past the limit still halt and restore)."),
    ("resume", "Continue a paused rollout (a paused bake starts over)."),
    ("promote", "Skip the current wave's bake."),
    ("abort", "Stop the rollout and restore every node it changed to its previous plan."),
):
    _verb_command(_verb, _doc)
