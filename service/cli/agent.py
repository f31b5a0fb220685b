"""``preflight agent``: the GPU node's bootstrap agent. The commands parse their options and hand the work to
service/agent (``run``'s whole boot protocol is agent/boot.py's ``Boot``); nothing of the service (FastAPI,
SQLAlchemy) is loaded on a node."""

import json
import os
import pathlib

import typer

from ..agent import EXIT_REFUSED, EXIT_UNAVAILABLE
from . import common

agent_app = typer.Typer(help="The GPU node bootstrap agent.", no_args_is_help=True, rich_markup_mode="markdown")

SERVER = typer.Option(..., envvar="PREFLIGHT_SERVER")
NODE = typer.Option(..., envvar="PREFLIGHT_NODE")
TOKEN = typer.Option(None, envvar="PREFLIGHT_TOKEN")
TOKEN_FILE = typer.Option(
    None,
    envvar="PREFLIGHT_TOKEN_FILE",
    help="Read the agent token from this file (as "
    "`preflight agent register --token-file` wrote it) instead of --token.",
)
STATE = typer.Option(None, help="State file (default ~/.preflight/agent-NODE.json).")
ISSUER = typer.Option("preflight", envvar="PREFLIGHT_ISSUER", help="The iss plans must carry.")
AUDIENCE = typer.Option("preflight-agent", envvar="PREFLIGHT_AUDIENCE", help="The aud plans must carry.")
TRUST = typer.Option(
    ...,
    envvar="PREFLIGHT_TRUST",
    help="The node's trust root: a JWKS file installed at provisioning (saved /.well-known/jwks.json "
    "or `preflight keys export`). Updated only through the service's signed key-set chain.",
)
PRINT_ONLY = typer.Option(
    True,
    "--print/--exec",
    help="Print the command, or run it (the agent supervises it and "
    "reports started / running / heartbeat / stopped / exited).",
)
WAIT = typer.Option(
    False,
    "--wait",
    help="Wait while the node has no plan yet, or while the service is unreachable and no offline boot applies.",
)
POLL_SECONDS = typer.Option(30.0, help="Seconds between attempts with --wait.")
VLLM = typer.Option(
    None,
    envvar="PREFLIGHT_VLLM",
    help="The vllm executable this node runs (default: the first "
    "vllm on the agent's PATH at start). A plan never chooses it.",
)
OFFLINE_MAX_AGE = typer.Option(
    7 * 86400,
    envvar="PREFLIGHT_OFFLINE_MAX_AGE",
    help="When the service is unreachable at boot, run the last verified plan if the "
    "service confirmed it current at most this many seconds ago (0: never).",
)
HEARTBEAT_SECONDS = typer.Option(
    60.0, envvar="PREFLIGHT_HEARTBEAT_SECONDS", help="Seconds between heartbeat reports while vLLM runs."
)
GROUP_WAIT = typer.Option(
    600.0,
    envvar="PREFLIGHT_GROUP_WAIT",
    help="A worker of a multi-node group waits this many seconds for its head to start the same "
    "plan (the service withholds the plan until then), then exits 75 (with --wait: no "
    "limit).",
)
AUDIT_COPY = typer.Option(
    None,
    envvar="PREFLIGHT_AUDIT_COPY",
    help="Where the node keeps the longest signed audit checkpoint it has seen (default: next "
    "to the state file, STATE.checkpoint.jws); a shorter or rewritten chain later is "
    "reported.",
)
NVIDIA_SMI = typer.Option(
    "nvidia-smi", envvar="PREFLIGHT_NVIDIA_SMI", help="nvidia-smi, read before vLLM starts (GPUs, free memory)."
)
WEIGHTS_ROOT = typer.Option(
    None,
    envvar="PREFLIGHT_WEIGHTS_ROOT",
    help="Where this node keeps weights of remote models: s3://bucket/llama is checked in "
    "ROOT/bucket/llama (a local path uri is checked where it is). Without it a production plan "
    "for a remote model is refused, unless it was signed with weights_check skip.",
)
VERIFY_HASHES = typer.Option(
    False,
    "--verify-hashes",
    envvar="PREFLIGHT_VERIFY_HASHES",
    help="Also hash every shard the manifest recorded a SHA-256 for (reads all the weights at every boot).",
)
SIGSTORE_TRUST_CONFIG = typer.Option(
    None,
    envvar="PREFLIGHT_SIGSTORE_TRUST_CONFIG",
    help="A Sigstore ClientTrustConfig JSON to verify a Sigstore-signed model.sig with, offline (without it, "
    "model-signing fetches the public-good trust root through TUF). Key-signed weights need nothing.",
)
METRICS_SECONDS = typer.Option(
    60.0,
    envvar="PREFLIGHT_METRICS_SECONDS",
    min=0,
    max=3600,
    help="With --exec: sample vLLM's /metrics every N seconds and post each window for the tuning loop (0: off).",
)
METRICS_URL = typer.Option(
    None,
    envvar="PREFLIGHT_METRICS_URL",
    help="vLLM's Prometheus endpoint (default: http://127.0.0.1:PORT/metrics, PORT from the plan's --port, else 8000).",
)


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _agent_token(token: str | None, token_file: pathlib.Path | None) -> str:
    """--token as given, or the token in --token-file (a link is followed: a mounted Secret), only a regular file,
    at most 4 KiB, and only a token of the service's shape (agent/files.py)."""
    from ..agent.files import UnsafeFile, read_token_file

    if token:
        return token
    if token_file is None:
        typer.echo("preflight agent: give --token or --token-file (PREFLIGHT_TOKEN / PREFLIGHT_TOKEN_FILE)", err=True)
        raise typer.Exit(2)
    try:
        return read_token_file(token_file)
    except FileNotFoundError:
        typer.echo(
            f"preflight agent: the token file {token_file} does not exist (run `preflight agent register`)", err=True
        )
        raise typer.Exit(2)
    except UnsafeFile as exc:
        typer.echo(f"preflight agent: {exc}", err=True)
        raise typer.Exit(2)
    except OSError as exc:
        typer.echo(f"preflight agent: cannot read the token file {token_file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2)


def _resolve_vllm(vllm: str | None) -> str:
    import shutil

    path = shutil.which(vllm) if vllm else shutil.which("vllm")
    if not path:
        typer.echo(
            "preflight agent: no vllm executable: install vLLM on the agent's PATH or name it with --vllm PATH",
            err=True,
        )
        raise typer.Exit(2)
    return os.path.abspath(path)


def _load_trust(trust: pathlib.Path):
    from ..agent.trust import Trust, TrustError

    try:
        return Trust.load(trust)
    except TrustError as exc:
        typer.echo(f"preflight agent: {exc}", err=True)
        raise typer.Exit(2)


def _state_path(state: pathlib.Path | None, node: str) -> pathlib.Path:
    return state or pathlib.Path.home() / ".preflight" / f"agent-{node}.json"


@agent_app.command("run")
def agent_run(
    server: str = SERVER,
    node: str = NODE,
    token: str | None = TOKEN,
    token_file: pathlib.Path | None = TOKEN_FILE,
    trust: pathlib.Path = TRUST,
    state: pathlib.Path | None = STATE,
    print_only: bool = PRINT_ONLY,
    wait: bool = WAIT,
    poll_seconds: float = POLL_SECONDS,
    vllm: str | None = VLLM,
    offline_max_age: float = OFFLINE_MAX_AGE,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    group_wait: float = GROUP_WAIT,
    issuer: str = ISSUER,
    audience: str = AUDIENCE,
    audit_copy: pathlib.Path | None = AUDIT_COPY,
    nvidia_smi: str = NVIDIA_SMI,
    weights_root: pathlib.Path | None = WEIGHTS_ROOT,
    verify_hashes: bool = VERIFY_HASHES,
    sigstore_trust_config: pathlib.Path | None = SIGSTORE_TRUST_CONFIG,
    metrics_seconds: float = METRICS_SECONDS,
    metrics_url: str | None = METRICS_URL,
) -> None:
    """Boot this node's current plan: verify it, check the node, then print or run it.

    Fetch the plan with a fresh freshness statement, verify both against the pinned trust root, save it, then print
    or run exactly its argv with the node's vllm (with --exec, after the GPU, weights and free-memory checks). Every
    start runs the current plan again (after a reboot, a crash or a restart); a plan older than the last one
    accepted never runs."""
    from ..agent.boot import Boot, BootOptions
    from ..agent.client import AgentClient

    token = _agent_token(token, token_file)
    tr = _load_trust(trust)
    vllm_path = None if print_only else _resolve_vllm(vllm)
    state_path = _state_path(state, node)
    options = BootOptions(
        node=node,
        state_path=state_path,
        checkpoint_copy=audit_copy or state_path.with_suffix(".checkpoint.jws"),
        issuer=issuer,
        audience=audience,
        print_only=print_only,
        wait=wait,
        poll_seconds=poll_seconds,
        vllm_path=vllm_path,
        offline_max_age=offline_max_age,
        heartbeat_seconds=heartbeat_seconds,
        group_wait=group_wait,
        metrics_seconds=metrics_seconds,
        metrics_url=metrics_url,
    )
    probe = None
    if not print_only:
        from ..agent.bootcheck import NodeProbe
        from ..tensor_readers import directory_layout

        probe = NodeProbe(
            nvidia_smi=nvidia_smi,
            weights_root=weights_root,
            verify_hashes=verify_hashes,
            layout_reader=directory_layout,
            sigstore_trust_config=sigstore_trust_config,
        )
    outcome = Boot(
        options, client=AgentClient(server, node, token), trust=tr, probe=probe, err=_say, out=typer.echo
    ).run()
    raise typer.Exit(outcome.code)


def _read_facts(nvidia_smi: str) -> dict:
    """The node's facts as nvidia-smi reads them; exit 2 when it cannot, or when the GPUs are of mixed models."""
    from ..agent.gpus import NvidiaSmiError, mixed_models, node_facts, read_gpus, read_interconnect

    try:
        gpus = read_gpus(nvidia_smi)
        facts = node_facts(gpus, read_interconnect(nvidia_smi, len(gpus)))
    except NvidiaSmiError as exc:
        typer.echo(f"preflight agent register: {exc}", err=True)
        raise typer.Exit(2)
    mixed = mixed_models(gpus)
    if mixed:
        typer.echo(f"preflight agent register: {mixed}: nothing registered", err=True)
        raise typer.Exit(2)
    return facts


def _kept_token(token_file: pathlib.Path) -> str:
    """The agent token TOKEN_FILE holds ("" when none), once the file is known writable: the new token must be
    writable before the service rotates anything (a failed write would lock the node out)."""
    from ..agent.files import UnsafeFile, read_token_file

    if token_file.is_symlink():  # register writes this file: a link is never replaced behind the operator's back
        typer.echo(
            f"preflight agent register: the token file {token_file} is a symlink: refused (register writes "
            f"the token file; name the file itself): nothing changed",
            err=True,
        )
        raise typer.Exit(2)
    try:
        kept = read_token_file(token_file)
    except (UnsafeFile, OSError):  # none, not a token (a corrupted file) or not a regular file: enrol again
        kept = ""  # (a directory fails below)
    try:
        token_file.parent.mkdir(parents=True, exist_ok=True)
        if (
            token_file.is_dir()
            or (token_file.exists() and not os.access(token_file.parent, os.W_OK))
            or not os.access(token_file.parent, os.W_OK)
        ):
            raise OSError(f"{token_file} cannot be written")
    except OSError as exc:
        typer.echo(f"preflight agent register: {exc}: nothing changed", err=True)
        raise typer.Exit(2)
    return kept


def _send_facts(
    server: str, node: str, body: dict, *, kept: str, enroll_token: str, rotate_token: bool, token_file: pathlib.Path
):
    """PUT the facts: with the kept token while it is this node's live one, else with the enrollment token (which
    issues a new agent token and revokes the node's old ones). Exit 75 when the service cannot be reached."""
    import httpx

    try:
        r = None
        if kept and not rotate_token:  # the kept token proves itself: it may update its own node's facts
            r = common.client(server, kept).put(f"/v1/nodes/{node}/facts", json=body)
            if r.status_code == 403:  # a live token of another node: a mistyped --node would take that node over
                typer.echo(
                    f"preflight agent register: the token in {token_file} is live but not {node}'s: refusing "
                    f"to take {node} over (check --node, or pass --rotate-token on purpose)",
                    err=True,
                )
                raise typer.Exit(2)
            if r.status_code == 401:  # revoked: a new one (old ones revoked)
                typer.echo(
                    f"preflight agent register: the token in {token_file} is no longer valid; issuing a new one",
                    err=True,
                )
                r = None
        if r is None:
            r = common.client(server, enroll_token).put(f"/v1/nodes/{node}/facts", json={**body, "rotate_token": True})
    except httpx.HTTPError as exc:
        typer.echo(f"preflight agent register: {server}: {exc}", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE)
    common.fail_on_problem(r)
    return r


@agent_app.command("register")
def agent_register(
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    node: str = typer.Option(..., envvar="PREFLIGHT_NODE", help="This node's name."),
    enroll_token: str = typer.Option(..., envvar="PREFLIGHT_ENROLL_TOKEN", help="An enroller token (or an admin's)."),
    token_file: pathlib.Path = typer.Option(
        ..., help="Where the node's agent token is written (mode 0600, atomically); shown nowhere else."
    ),
    address: str | None = typer.Option(
        None, help="IP address or DNS name the other nodes of a multi-node instance reach this node at."
    ),
    nvidia_smi: str = typer.Option("nvidia-smi", envvar="PREFLIGHT_NVIDIA_SMI"),
    rotate_token: bool = typer.Option(
        False,
        "--rotate-token",
        help="Issue a new agent token even when TOKEN_FILE holds one (the node's other tokens are revoked).",
    ),
) -> None:
    """Register this node (or update its facts) from what nvidia-smi reads, with an enrollment token.

    The facts: GPU model, count, memory, compute capability, NVLink or PCIe. Safe to re-run: while TOKEN_FILE holds
    the node's live agent token, the facts are sent with it and it is kept; otherwise (a new or re-imaged node, a
    revoked token) the enrollment token registers or updates the node and a new agent token is issued, the node's
    old ones revoked. TOKEN_FILE must not be a symlink (register writes it)."""
    from ..agent.trust import write_text_atomic

    facts = _read_facts(nvidia_smi)
    kept = _kept_token(token_file)
    body = {**facts, **({"address": address} if address is not None else {})}  # left out: the stored one stays
    r = _send_facts(
        server, node, body, kept=kept, enroll_token=enroll_token, rotate_token=rotate_token, token_file=token_file
    )
    out = r.json()
    secret = out.pop("agent_token", None)
    if secret:
        try:
            write_text_atomic(token_file, secret + "\n")
        except OSError as exc:  # the service already rotated: say where the token went
            typer.echo(
                f"preflight agent register: the new agent token could not be written to {token_file} "
                f"({exc}); run again with --rotate-token once the file can be written",
                err=True,
            )
            raise typer.Exit(2)
    gpu = out["gpu"]
    typer.echo(
        f"{'registered' if r.status_code == 201 else 'updated'} {node}: {out['gpu_count']} × "
        f"{gpu.get('name')} ({gpu.get('id')}), {gpu.get('memory_bytes', 0) // 2**20} MiB, "
        f"interconnect {out.get('interconnect') or '-'}; agent token "
        f"{'written to ' + str(token_file) if secret else 'kept in ' + str(token_file)}"
    )


@agent_app.command("verify")
def agent_verify(
    file: pathlib.Path = typer.Argument(..., help="A saved compact JWS plan."),
    node: str = NODE,
    trust: pathlib.Path = typer.Option(
        ..., "--trust", "--jwks", envvar="PREFLIGHT_TRUST", help="The node's trust file (a JWKS)."
    ),
    freshness: pathlib.Path | None = typer.Option(
        None, help="Also check this saved freshness statement (the X-Plan-Freshness header)."
    ),
    last_seq: int = typer.Option(0, help="Refuse plans below this seq."),
    issuer: str = ISSUER,
    audience: str = AUDIENCE,
) -> None:
    """Verify a saved plan offline against the node's trust file.

    No server is asked anything; with --freshness the saved freshness statement is checked too."""
    from ..agent.verify import VerificationError, verify_freshness, verify_plan

    tr = _load_trust(trust)
    try:
        token = file.read_text().strip()
        plan = verify_plan(token, tr.jwks, node=node, audience=audience, issuer=issuer, last_seq=last_seq)
        if freshness:
            verify_freshness(
                freshness.read_text().strip(),
                tr.jwks,
                plan_token=token,
                plan=plan,
                node=node,
                audience=audience,
                issuer=issuer,
            )
    except OSError as exc:
        typer.echo(f"INVALID: {exc}", err=True)
        raise typer.Exit(2)
    except VerificationError as exc:
        typer.echo(f"INVALID: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED)
    typer.echo(json.dumps(plan.claims, indent=2))


@agent_app.command("reset")
def agent_reset(
    server: str = SERVER,
    node: str = NODE,
    token: str | None = TOKEN,
    token_file: pathlib.Path | None = TOKEN_FILE,
    state: pathlib.Path | None = STATE,
    reason: str = typer.Option(..., help="Why (recorded in the audit)."),
) -> None:
    """Reset this node's agent state on purpose, recorded in the audit first.

    For a state that holds a seq no genuine plan reaches, say. The reset is first recorded in the service's audit
    (agent.reset, with the state it replaces); without that record nothing changes. The old file is kept beside the
    new one as STATE.reset-<UTC time>."""
    from ..agent.client import AgentClient, AgentState, StateCorrupt

    token = _agent_token(token, token_file)
    path = _state_path(state, node)
    try:
        old = AgentState.load(path)
        previous = {"last_seq": old.last_seq, "plan_id": old.plan_id}
    except StateCorrupt as exc:
        previous = {"unreadable": str(exc)[:500]}
    client = AgentClient(server, node, token)
    if not client.report(
        None, "reset", f"agent state reset on purpose: {reason}", {"reason": reason[:1000], "previous": previous}
    ):
        typer.echo("preflight agent: the service did not record the reset; the state is unchanged", err=True)
        raise typer.Exit(1)
    if os.path.lexists(path):
        aside = AgentState(path=path).set_aside("reset")
        typer.echo(f"previous state kept as {aside}")
    AgentState(path=path).save()
    typer.echo(f"reset {path} (recorded in the audit as agent.reset)")
