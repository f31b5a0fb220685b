"""``preflight audit``: the audit log, read from the service's database (verify, export, runs, checkpoints)."""

import json
import pathlib
import shlex
import sys

import typer

from . import common

audit_app = typer.Typer(help="The audit log.", no_args_is_help=True, rich_markup_mode="markdown")


def _jwks(jwks_file: pathlib.Path | None, server: str | None) -> dict:
    if jwks_file:
        return json.loads(jwks_file.read_text())
    if server:
        import httpx

        return httpx.get(server.rstrip("/") + "/.well-known/jwks.json", timeout=30).json()
    from ..signing import KeyError_, KeyStore

    try:  # the local key directory: retired keys too (a checkpoint they signed still verifies for an auditor)
        return KeyStore(common.settings().key_dir, create=False).audit_jwks()
    except KeyError_:
        return {"keys": []}


@audit_app.command("verify")
def audit_verify(
    checkpoint: pathlib.Path | None = typer.Option(
        None, "--checkpoint", help="A checkpoint (JWS) saved earlier: the chain must still match it."
    ),
    jwks_file: pathlib.Path | None = typer.Option(None, "--jwks", help="JWKS file (default: local keys)."),
    server: str | None = typer.Option(None, help="Fetch the JWKS from this server."),
) -> None:
    """Recompute the audit chain from the database, read-only (never seals): links, hashes, MACs (with the local
    keys), unsealed, forged or copied rows, the chain's end against the recorded head (a cut tail), tokens, plans,
    assignments and rollouts without their events (orphans), and the chain against the newest signed checkpoint
    found (stored, the data-dir file, and --checkpoint FILE). Exit 0 intact, 1 broken or cut, 2 no database to read."""
    from sqlalchemy.exc import OperationalError

    from .. import audit

    s_ = common.settings()
    jwks = _jwks(jwks_file, server)
    files = [s_.checkpoint_file]
    claims = None
    if checkpoint is not None:
        try:
            claims = audit.read_checkpoint_file(checkpoint, jwks)
        except ValueError as exc:
            typer.echo(json.dumps({"ok": False, "reason": str(exc)}))
            raise typer.Exit(1)
        if claims is None:
            typer.echo(f"preflight: {checkpoint} does not exist", err=True)
            raise typer.Exit(2)
    try:
        with common.database(s_).read() as s:  # a snapshot: the running service goes on writing
            found, problems = audit.known_checkpoints(s, jwks, files)
            if claims is not None:  # --checkpoint FILE, read above
                found.append({**claims, "source": str(checkpoint)})
            result = audit.verify_chain(s, checkpoints=found)
    except OperationalError as exc:  # no database there is not a broken chain: say where it looked
        typer.echo(
            f"preflight: cannot read the audit log at {s_.resolved_database_url.split('@')[-1]!r} "
            f"({str(exc.orig).splitlines()[0] if exc.orig else 'no connection'}): set PREFLIGHT_DATABASE_URL "
            f"or run from the service's directory",
            err=True,
        )
        raise typer.Exit(2) from None
    if problems:
        result["warnings"] = problems
    typer.echo(json.dumps(result))
    raise typer.Exit(0 if result["ok"] else 1)


@audit_app.command("export")
def audit_export_cmd(
    fmt: str = typer.Option("jsonl", "--format", help="jsonl or csv"),
    out: pathlib.Path | None = typer.Option(None, help="File to write (default: stdout)."),
    node: str | None = None,
    plan: str | None = None,
    model: str | None = None,
    kind: str | None = None,
    since: str | None = typer.Option(None, help="ISO 8601 time"),
    until: str | None = typer.Option(None, help="ISO 8601 time"),
) -> None:
    """Export the audit log (filtered) as JSON Lines or CSV, read from the database."""
    import datetime as dt

    from sqlalchemy import select

    from ..db.models import AuditEvent
    from ..db.session import Database
    from ..services.audit_export import stream

    if fmt not in ("jsonl", "csv"):
        typer.echo("preflight: --format must be jsonl or csv", err=True)
        raise typer.Exit(2)
    q = select(AuditEvent).order_by(AuditEvent.id)
    for col, value in (
        (AuditEvent.node, node),
        (AuditEvent.plan_id, plan),
        (AuditEvent.model, model),
        (AuditEvent.kind, kind),
    ):
        if value:
            q = q.where(col == value)
    try:
        if since:
            q = q.where(AuditEvent.ts >= dt.datetime.fromisoformat(since))
        if until:
            q = q.where(AuditEvent.ts < dt.datetime.fromisoformat(until))
    except ValueError as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    sink = out.open("w", newline="") if out else sys.stdout
    db = Database(common.settings().resolved_database_url)  # read-only: unsealed events are exported with seq null
    try:
        for chunk in stream(db, q, fmt):
            sink.write(chunk)
    finally:
        if out:
            sink.close()


@audit_app.command("runs")
def audit_runs(
    node: str = typer.Option(..., help="The node."),
    at: str | None = typer.Option(None, help="ISO 8601 time: the run(s) in progress then."),
    since: str | None = typer.Option(None, help="ISO 8601 time"),
    until: str | None = typer.Option(None, help="ISO 8601 time"),
    as_json: bool = typer.Option(False, "--json", help="The runs as JSON."),
) -> None:
    """Which plan ran on a node at a time (or in a range), read from the database: one line per run. Exit 1 when
    nothing ran then."""
    import datetime as dt

    from ..db.session import Database
    from ..errors import NotFound
    from ..services import history

    def parse(name, value):
        if value is None:
            return None
        try:
            t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            typer.echo(f"preflight: --{name} {value!r} is not an ISO 8601 time", err=True)
            raise typer.Exit(2)
        return t if t.tzinfo else t.replace(tzinfo=dt.UTC)

    if at and (since or until):
        typer.echo("preflight: give either --at or --since/--until", err=True)
        raise typer.Exit(2)
    t = parse("at", at)
    lo, hi = (t, t + dt.timedelta(microseconds=1)) if t else (parse("since", since), parse("until", until))
    try:
        with Database(common.settings().resolved_database_url).transaction() as s:
            out = history.node_runs(s, node, since=lo, until=hi)
    except NotFound as exc:
        typer.echo(f"preflight: {exc.detail}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for r in out["items"]:
            m = r["manifest"] or {}
            end = (
                (
                    f"{r['ended_at']} ({r['end']}"
                    + (f", status {r['exit_status']}" if r["exit_status"] is not None else "")
                    + ")"
                )
                if r["ended_at"]
                else f"still running (last heartbeat {r['last_heartbeat_at'] or 'none'})"
            )
            typer.echo(
                f"{r['started_at']} → {end}  plan {r['plan_id']} seq {r['seq']}  "
                f"{m.get('name')}@{m.get('version')}  {shlex.join(r['argv'] or [])}"
            )
        if not out["items"]:
            typer.echo(f"nothing ran on {node} {'at ' + at if at else 'in that range'}")
    raise typer.Exit(0 if out["items"] else 1)


@audit_app.command("checkpoint")
def audit_checkpoint(out: pathlib.Path = typer.Option(..., help="Where to write the signed checkpoint (JWS).")) -> None:
    """Sign the current chain head with the service key: stored, written to the data dir, and saved to --out."""
    from .. import audit
    from ..agent.verify import verify_jws
    from ..signing import KeyStore

    s_ = common.settings()
    keys = KeyStore(s_.key_dir, create=False)
    checkpointer = audit.Checkpointer(
        keys,
        s_.issuer,
        s_.checkpoint_file,
        every_events=s_.audit_checkpoint_events,
        every_seconds=s_.audit_checkpoint_seconds,
    )
    db = common.database(s_)
    with db.transaction() as s:
        audit.chain_lock(s, wait=True)
        try:
            row = checkpointer.make(s) or checkpointer.newest_row(s)
        except ValueError as exc:
            typer.echo(f"preflight: {exc}", err=True)
            raise typer.Exit(1)
        if row is None:
            typer.echo("preflight: the audit chain is empty: nothing to checkpoint", err=True)
            raise typer.Exit(1)
    checkpointer.publish(row)
    out.write_text(row.signed + "\n")
    claims, _ = verify_jws(row.signed, keys.jwks(), typ=audit.CHECKPOINT_TYPE)
    typer.echo(json.dumps(claims))


@audit_app.command("check-checkpoint")
def audit_check_checkpoint(
    file: pathlib.Path = typer.Argument(..., help="A saved checkpoint JWS."),
    jwks_file: pathlib.Path | None = typer.Option(None, "--jwks", help="JWKS file (default: local keys)."),
    server: str | None = typer.Option(None, help="Fetch the JWKS from this server."),
) -> None:
    """Verify a checkpoint's signature, then recompute this database's chain up to it. Exit 0 match, 1 mismatch."""
    from .. import audit
    from ..agent.verify import VerificationError, verify_jws

    if jwks_file:
        jwks = json.loads(jwks_file.read_text())
    elif server:
        import httpx

        jwks = httpx.get(server.rstrip("/") + "/.well-known/jwks.json", timeout=30).json()
    else:
        from ..signing import KeyStore

        jwks = KeyStore(common.settings().key_dir, create=False).audit_jwks()  # retired keys too
    try:
        claims, kid = verify_jws(file.read_text().strip(), jwks, typ=audit.CHECKPOINT_TYPE)
    except VerificationError as exc:
        typer.echo(json.dumps({"ok": False, "reason": str(exc)}))
        raise typer.Exit(1)
    with common.database().transaction() as s:
        result = audit.check_checkpoint(s, claims)
    typer.echo(json.dumps({**result, "kid": kid}))
    raise typer.Exit(0 if result["ok"] else 1)
