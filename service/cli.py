"""The ``preflight`` command line (Typer): serve, migrate, check, manifest push, agent run/verify, keys, audit."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import sys
import time
from typing import Optional

import typer

app = typer.Typer(help="Preflight: validate, sign and audit vLLM launch configurations.", no_args_is_help=True)
manifest_app = typer.Typer(help="Weight manifests.", no_args_is_help=True)
agent_app = typer.Typer(help="The GPU node bootstrap agent.", no_args_is_help=True)
keys_app = typer.Typer(help="Signing keys.", no_args_is_help=True)
audit_app = typer.Typer(help="The audit log.", no_args_is_help=True)
app.add_typer(manifest_app, name="manifest")
app.add_typer(agent_app, name="agent")
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")


def _settings():
    from .settings import Settings

    try:
        return Settings()
    except Exception as exc:  # pydantic ValidationError: say it plainly
        typer.echo(f"preflight: invalid settings: {exc}", err=True)
        raise typer.Exit(2)


def _database(settings=None):
    """The database of the settings, with the service's audit MAC keys when the key directory is at hand (events
    the CLI writes are then accepted by the sealer, and verify checks every MAC); never creates a key."""
    from .audit import AuditKeys
    from .db.session import Database
    from .signing import KeyError_, KeyStore

    settings = settings or _settings()
    try:
        keys = AuditKeys(KeyStore(settings.key_dir, create=False))
    except (KeyError_, OSError, ValueError):
        keys = None
    return Database(settings.resolved_database_url, audit_keys=keys)


def bootstrap_admin_token(settings, db) -> tuple[str | None, bool]:
    """The admin token to print: PREFLIGHT_ADMIN_TOKEN, or one generated on first start (kept in the data dir,
    mode 0600, and stored hashed in the database). Returns (token, generated_now); the token is None when the one
    kept in the data dir has been revoked (a dead token is never printed)."""
    from .services import tokens

    if settings.admin_token:
        return None, False
    path = settings.data_dir / "admin-token"
    if path.exists():
        kept = path.read_text().strip()
        with db.transaction() as s:
            live = tokens.is_live(s, kept)
        return (kept if live else None), False
    with db.transaction() as s:
        secret, _ = tokens.create(s, role="admin", label="bootstrap admin token")
        from . import audit

        audit.append(s, actor="preflight", kind="token.created", subject="token:bootstrap-admin",
                     payload={"role": "admin", "label": "bootstrap admin token"})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return secret, True


@app.command()
def migrate() -> None:
    """Apply the database migrations (Alembic upgrade head)."""
    from .db.migrate import upgrade

    s = _settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(s.resolved_database_url)
    typer.echo(f"migrated {s.resolved_database_url.split('@')[-1]}")


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="Interface to bind."),
          port: int = typer.Option(8000, help="Port."),
          workers: int = typer.Option(1, help="uvicorn worker processes."),
          no_migrate: bool = typer.Option(False, "--no-migrate", help="Do not apply migrations first.")) -> None:
    """Run the HTTP service (applies migrations, creates the signing key and admin token on first start)."""
    import uvicorn

    from .audit import AuditKeys
    from .db.migrate import upgrade
    from .db.session import Database
    from .signing import KeyError_, KeyStore

    s = _settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    if not no_migrate:
        upgrade(s.resolved_database_url)
    try:
        keys = KeyStore(s.key_dir, create=s.env != "production")
    except KeyError_ as exc:
        typer.echo(f"preflight: refusing to start: {exc} (production never generates a key: run `preflight keys "
                   f"init` once, or mount the keys at PREFLIGHT_SIGNING_KEY_DIR)", err=True)
        raise typer.Exit(2)
    db = Database(s.resolved_database_url, audit_keys=AuditKeys(keys))
    token, generated = bootstrap_admin_token(s, db)
    typer.echo(f"Preflight on http://{host}:{port}  (API docs: http://{host}:{port}/docs)")
    typer.echo(f"database: {s.resolved_database_url.split('@')[-1]}; signing key: {keys.active_kid}")
    if token:
        typer.echo(f"admin token{' (new)' if generated else ''}: {token}")
    elif s.admin_token:
        typer.echo("admin token: the value of PREFLIGHT_ADMIN_TOKEN")
    else:
        typer.echo(f"admin token: the one in {s.data_dir / 'admin-token'} has been revoked (not printed); use another "
                   "admin token, or set PREFLIGHT_ADMIN_TOKEN")
    uvicorn.run("service.api.main:app", host=host, port=port, workers=workers, log_level="warning",
                access_log=False)  # access lines come from the app, as JSON with a request id


def _load_request_file(path: pathlib.Path) -> dict:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("a launch request file must hold one JSON object")
    model = data.get("model")
    if isinstance(model, dict) and model.get("path") and model.get("config") is None:
        d = pathlib.Path(model["path"])
        if not d.is_absolute() and not d.exists():
            d = path.parent / d  # relative to the request file when not relative to the working directory
        model = {"name": str(model["path"]), **model, **read_model_dir(d)}
        model.pop("path", None)
        data = {**data, "model": model}
    return data


def read_model_dir(d: pathlib.Path) -> dict:
    """config.json (required), quantization.txt, hf_quant_config.json and the safetensors index's total_size."""
    if not (d / "config.json").is_file():
        raise ValueError(f"{d} has no config.json")
    out: dict = {"config": json.loads((d / "config.json").read_text())}
    if (d / "quantization.txt").is_file():
        out["quantization_txt"] = (d / "quantization.txt").read_text()
    if (d / "hf_quant_config.json").is_file():
        out["hf_quant_config"] = json.loads((d / "hf_quant_config.json").read_text())
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        total = (json.loads(idx.read_text()).get("metadata") or {}).get("total_size")
        if isinstance(total, int):
            out["weights_bytes"] = total
    return out


def _print_report(name: str, result) -> None:
    r = result.as_dict()
    typer.echo(f"== {name}: {r['verdict'].upper()}")
    for f in r["findings"]:
        typer.echo(f"  [{f['severity']}] {f['rule']}: {f['message']}")
        if f.get("remedy"):
            typer.echo(f"      remedy: {json.dumps(f['remedy'])}")
    b = r.get("budget")
    if b:
        typer.echo(f"  budget per GPU: weights {b.get('weights_bytes_per_gpu', 0) / 2**30:.2f} GiB, "
                   f"KV cache {b.get('kv_cache_bytes_per_gpu', 0) / 2**30:.2f} GiB")
        if b.get("log_line"):
            typer.echo(f"  {b['log_line']}")
    typer.echo(f"  command: {r['command']}")


@app.command()
def check(files: list[pathlib.Path] = typer.Argument(..., help="Launch-request JSON files."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line.")) -> None:
    """Validate launch-request files offline. Exit 0: nothing rejected; 1: a launch is rejected; 2: bad input."""
    from pydantic import ValidationError

    from .domain.errors import DomainError
    from .domain.request import LaunchRequest
    from .domain.validate import validate

    rejected = bad = False
    for path in files:
        try:
            req = LaunchRequest.model_validate(_load_request_file(path))
            result = validate(req)
        except (OSError, ValueError, ValidationError, DomainError, RecursionError) as exc:
            bad = True
            if isinstance(exc, RecursionError):  # JSON nested deeper than the parser can go
                exc = ValueError("the file's JSON is nested too deeply")
            errors = ([{"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]}
                       for e in exc.errors()] if isinstance(exc, ValidationError)
                      else [exc.as_dict()] if isinstance(exc, DomainError) else [{"message": str(exc)}])
            if as_json:
                typer.echo(json.dumps({"file": str(path), "verdict": "invalid", "errors": errors}))
            else:
                typer.echo(f"== {path}: INVALID INPUT", err=False)
                for e in errors:
                    typer.echo(f"  {e.get('field', '')}: {e.get('message')}")
            continue
        rejected |= result.verdict == "reject"
        if as_json:
            typer.echo(json.dumps({"file": str(path), **result.as_dict()}, separators=(",", ":")))
        else:
            _print_report(str(path), result)
    raise typer.Exit(2 if bad else 1 if rejected else 0)


def _client(server: str, token: str):
    import httpx

    return httpx.Client(base_url=server.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _fail_on_problem(r) -> None:
    if r.status_code >= 400:
        typer.echo(f"preflight: HTTP {r.status_code}: {r.text}", err=True)
        raise typer.Exit(1)


@manifest_app.command("push")
def manifest_push(directory: pathlib.Path = typer.Argument(..., help="Model directory holding config.json."),
                  server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
                  name: Optional[str] = typer.Option(None, help="Manifest name (default: the directory name)."),
                  version: str = typer.Option("1", help="Manifest version."),
                  uri: Optional[str] = typer.Option(None, help="Where nodes load the weights (default: the path)."),
                  tp_sharded: Optional[int] = typer.Option(None, help="Checkpoint saved per rank at this TP.")) -> None:
    """Register a model directory as a manifest."""
    try:
        body = read_model_dir(directory)
    except (OSError, ValueError) as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    body.update(name=name or directory.name, version=version, uri=uri or str(directory.resolve()),
                checkpoint={"layout": "tp_sharded", "tensor_parallel_size": tp_sharded} if tp_sharded
                else {"layout": "merged"})
    r = _client(server, token).post("/v1/manifests", json=body)
    _fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))


@agent_app.command("run")
def agent_run(server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
              node: str = typer.Option(..., envvar="PREFLIGHT_NODE"),
              token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
              state: Optional[pathlib.Path] = typer.Option(None, help="State file (default ~/.preflight/agent-NODE.json)."),
              print_only: bool = typer.Option(True, "--print/--exec",
                                              help="Print the command, or run it (the agent supervises it and "
                                                   "reports started / running / failed)."),
              wait: bool = typer.Option(False, "--wait", help="Poll until a new plan is published."),
              poll_seconds: float = typer.Option(60.0, help="Long-poll window per request with --wait.")) -> None:
    """Fetch this node's plan, verify it offline against the JWKS, then print or exec exactly its argv."""
    from .agent.client import AgentClient, AgentState
    from .agent.verify import VerificationError, verify_plan

    st = AgentState.load(state or pathlib.Path.home() / ".preflight" / f"agent-{node}.json")
    client = AgentClient(server, node, token)
    s = _settings()
    said = None
    while True:
        r = client.fetch(st.etag, wait=int(poll_seconds) if wait else 0)
        if r.status_code == 304 or (r.status_code == 404 and wait):
            if not wait:
                typer.echo(f"plan unchanged (seq {st.last_seq}); nothing to do")
                raise typer.Exit(0)
            if said != r.status_code:  # say once what it is waiting for
                typer.echo(f"preflight agent: {node} has no plan yet; waiting" if r.status_code == 404 else
                           f"preflight agent: plan unchanged (seq {st.last_seq}); waiting for a newer one", err=True)
                said = r.status_code
            if r.status_code == 404:
                time.sleep(min(poll_seconds, 30))
            continue
        break
    if r.status_code != 200:
        typer.echo(f"preflight agent: fetch failed: HTTP {r.status_code}: {r.text}", err=True)
        raise typer.Exit(1)
    plan_id = r.headers.get("X-Plan-Id", "")
    try:
        plan = verify_plan(r.text, client.jwks(), node=node, audience=s.audience, last_seq=st.last_seq)
    except VerificationError as exc:
        typer.echo(f"preflight agent: REFUSED plan {plan_id}: {exc}", err=True)
        if plan_id:
            client.report(plan_id, "failed", f"verification failed: {exc}", {"reason": exc.reason})
        raise typer.Exit(3)
    st.last_seq, st.etag, st.plan_id = plan.seq, r.headers.get("ETag"), plan.claims["jti"]
    st.save()
    env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.claims.get("env", {}).items()))
    command = (env_line + " " if env_line else "") + shlex.join(plan.argv)
    client.report(plan.claims["jti"], "fetched", f"verified seq {plan.seq} with key {plan.kid}")
    if print_only:
        typer.echo(command)
        raise typer.Exit(0)
    from .agent import runner

    env = {**os.environ, **plan.claims.get("env", {})}
    code = runner.run(plan.argv, env, lambda status, msg, details: client.report(plan.claims["jti"], status, msg,
                                                                                 details))
    raise typer.Exit(code)


@agent_app.command("verify")
def agent_verify(file: pathlib.Path = typer.Argument(..., help="A saved compact JWS."),
                 server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                 node: str = typer.Option(..., envvar="PREFLIGHT_NODE"),
                 jwks_file: Optional[pathlib.Path] = typer.Option(None, "--jwks", help="Use this JWKS (offline)."),
                 last_seq: int = typer.Option(0, help="Refuse plans at or below this seq.")) -> None:
    """Verify a saved plan against the server's JWKS (or a saved JWKS file)."""
    import httpx

    from .agent.verify import VerificationError, verify_plan

    jwks = json.loads(jwks_file.read_text()) if jwks_file else httpx.get(
        server.rstrip("/") + "/.well-known/jwks.json", timeout=30).json()
    try:
        plan = verify_plan(file.read_text().strip(), jwks, node=node, audience=_settings().audience, last_seq=last_seq)
    except VerificationError as exc:
        typer.echo(f"INVALID: {exc}", err=True)
        raise typer.Exit(3)
    typer.echo(json.dumps(plan.claims, indent=2))


def _audit_key_event(kind: str, payload: dict) -> None:
    """Record a key change in the audit log when the database is reachable (a key change must not depend on it)."""
    from . import audit

    try:
        with _database().transaction() as s:
            audit.append(s, actor="cli", kind=kind, subject=f"key:{payload.get('kid')}", payload=payload)
    except Exception as exc:  # the key change itself stands; say that the log missed it
        typer.echo(f"preflight: warning: could not record {kind} in the audit log: {exc.__class__.__name__}", err=True)


@keys_app.command("rotate")
def keys_rotate() -> None:
    """Create a new active signing key; older keys stay published until retired."""
    from .signing import KeyStore

    kid = KeyStore(_settings().key_dir).rotate()
    _audit_key_event("key.rotated", {"kid": kid})
    typer.echo(kid)


@keys_app.command("init")
def keys_init() -> None:
    """Create the first signing key if the key directory has none (the one explicit step production needs)."""
    from .signing import KeyStore

    ks = KeyStore(_settings().key_dir, create=True)
    typer.echo(ks.active_kid)


@keys_app.command("retire")
def keys_retire(kid: str) -> None:
    """Stop publishing a key (plans it signed stop verifying)."""
    from .signing import KeyError_, KeyStore

    try:
        KeyStore(_settings().key_dir, create=False).retire(kid)
    except KeyError_ as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    _audit_key_event("key.retired", {"kid": kid})
    typer.echo(f"retired {kid}")


@keys_app.command("list")
def keys_list() -> None:
    """Print the published JWKS."""
    from .signing import KeyStore

    typer.echo(json.dumps(KeyStore(_settings().key_dir).jwks(), indent=2))


def _jwks(jwks_file: Optional[pathlib.Path], server: Optional[str]) -> dict:
    if jwks_file:
        return json.loads(jwks_file.read_text())
    if server:
        import httpx

        return httpx.get(server.rstrip("/") + "/.well-known/jwks.json", timeout=30).json()
    from .signing import KeyError_, KeyStore

    try:
        return KeyStore(_settings().key_dir, create=False).jwks()
    except KeyError_:
        return {"keys": []}


@audit_app.command("verify")
def audit_verify(checkpoint: Optional[pathlib.Path] = typer.Option(
                     None, "--checkpoint", help="A checkpoint (JWS) saved earlier: the chain must still match it."),
                 jwks_file: Optional[pathlib.Path] = typer.Option(None, "--jwks", help="JWKS file (default: local keys)."),
                 server: Optional[str] = typer.Option(None, help="Fetch the JWKS from this server.")) -> None:
    """Recompute the audit chain from the database, read-only (never seals): links, hashes, MACs (with the local
    keys), unsealed or forged rows, and the chain against the newest signed checkpoint found (stored, the data-dir
    file, and --checkpoint FILE). Exit 0 intact, 1 broken or cut."""
    from . import audit

    s_ = _settings()
    jwks = _jwks(jwks_file, server)
    files = [s_.checkpoint_file]
    if checkpoint is not None:
        try:
            claims = audit.read_checkpoint_file(checkpoint, jwks)
        except ValueError as exc:
            typer.echo(json.dumps({"ok": False, "reason": str(exc)}))
            raise typer.Exit(1)
        if claims is None:
            typer.echo(f"preflight: {checkpoint} does not exist", err=True)
            raise typer.Exit(2)
    with _database(s_).transaction() as s:
        found, problems = audit.known_checkpoints(s, jwks, files)
        if checkpoint is not None:
            found.append({**claims, "source": str(checkpoint)})
        result = audit.verify_chain(s, checkpoints=found)
    if problems:
        result["warnings"] = problems
    typer.echo(json.dumps(result))
    raise typer.Exit(0 if result["ok"] else 1)


@audit_app.command("export")
def audit_export_cmd(fmt: str = typer.Option("jsonl", "--format", help="jsonl or csv"),
                     out: Optional[pathlib.Path] = typer.Option(None, help="File to write (default: stdout)."),
                     node: Optional[str] = None, plan: Optional[str] = None, model: Optional[str] = None,
                     kind: Optional[str] = None, since: Optional[str] = typer.Option(None, help="ISO 8601 time"),
                     until: Optional[str] = typer.Option(None, help="ISO 8601 time")) -> None:
    """Export the audit log (filtered) as JSON Lines or CSV, read from the database."""
    import datetime as dt

    from sqlalchemy import select

    from .db.models import AuditEvent
    from .db.session import Database
    from .services.audit_export import stream

    if fmt not in ("jsonl", "csv"):
        typer.echo("preflight: --format must be jsonl or csv", err=True)
        raise typer.Exit(2)
    q = select(AuditEvent).order_by(AuditEvent.id)
    for col, value in ((AuditEvent.node, node), (AuditEvent.plan_id, plan), (AuditEvent.model, model),
                       (AuditEvent.kind, kind)):
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
    db = Database(_settings().resolved_database_url)  # read-only: unsealed events are exported with seq null
    try:
        for chunk in stream(db, q, fmt):
            sink.write(chunk)
    finally:
        if out:
            sink.close()


@audit_app.command("checkpoint")
def audit_checkpoint(out: pathlib.Path = typer.Option(..., help="Where to write the signed checkpoint (JWS).")) -> None:
    """Sign the current chain head with the service key: stored, written to the data dir, and saved to --out."""
    from . import audit
    from .agent.verify import verify_jws
    from .signing import KeyStore

    s_ = _settings()
    keys = KeyStore(s_.key_dir, create=False)
    checkpointer = audit.Checkpointer(keys, s_.issuer, s_.checkpoint_file, every_events=s_.audit_checkpoint_events,
                                      every_seconds=s_.audit_checkpoint_seconds)
    db = _database(s_)
    with db.transaction() as s:
        audit._lock(s, wait=True)
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
def audit_check_checkpoint(file: pathlib.Path = typer.Argument(..., help="A saved checkpoint JWS."),
                           jwks_file: Optional[pathlib.Path] = typer.Option(None, "--jwks",
                                                                            help="JWKS file (default: local keys)."),
                           server: Optional[str] = typer.Option(None, help="Fetch the JWKS from this server.")) -> None:
    """Verify a checkpoint's signature, then recompute this database's chain up to it. Exit 0 match, 1 mismatch."""
    from . import audit
    from .agent.verify import VerificationError, verify_jws
    from .db.session import Database

    if jwks_file:
        jwks = json.loads(jwks_file.read_text())
    elif server:
        import httpx

        jwks = httpx.get(server.rstrip("/") + "/.well-known/jwks.json", timeout=30).json()
    else:
        from .signing import KeyStore

        jwks = KeyStore(_settings().key_dir, create=False).jwks()
    try:
        claims, kid = verify_jws(file.read_text().strip(), jwks, typ=audit.CHECKPOINT_TYPE)
    except VerificationError as exc:
        typer.echo(json.dumps({"ok": False, "reason": str(exc)}))
        raise typer.Exit(1)
    with _database().transaction() as s:
        result = audit.check_checkpoint(s, claims)
    typer.echo(json.dumps({**result, "kid": kid}))
    raise typer.Exit(0 if result["ok"] else 1)


@app.command("upgrade-check")
def upgrade_check(to: str = typer.Option(..., "--to", help="The vLLM version to upgrade (or downgrade) to, e.g. 0.33"),
                  server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
                  as_json: bool = typer.Option(False, "--json", help="Print the service's answer as JSON.")) -> None:
    """Re-validate every active plan (and every manifest's newest plan) against another vLLM version and list what
    would break. Exit 0 nothing breaks, 1 something breaks, 2 bad input."""
    r = _client(server, token).get("/v1/upgrade-impact", params={"vllm_version": to})
    if r.status_code == 422:
        typer.echo(f"preflight: {r.json().get('detail', r.text)}", err=True)
        raise typer.Exit(2)
    _fail_on_problem(r)
    out = r.json()
    if as_json:
        typer.echo(json.dumps(out, indent=1))
    else:
        typer.echo(f"vLLM {out['vllm_version']} (catalogue {out['catalogue']}): {out['checked']} plans checked, "
                   f"{out['breaking']} would break")
        for p in out["plans"]:
            if not p["breaks"]:
                continue
            typer.echo(f"BREAKS plan {p['plan']} ({p['manifest']}, {p['from_version']} -> {p['to_version']}, nodes "
                       f"{', '.join(p['nodes']) or '-'})")
            for f in p["findings"]:
                remedy = f" remedy {json.dumps(f['remedy'])}" if f.get("remedy") else ""
                typer.echo(f"  {f['rule']}: {f['message']}{remedy}")
    raise typer.Exit(1 if out["breaking"] else 0)


tokens_app = typer.Typer(help="Bearer tokens (admin).", no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def tokens_create(role: str = typer.Argument(..., help="admin, deployer or auditor"),
                  label: Optional[str] = None,
                  server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN")) -> None:
    """Create a token; the secret is printed once."""
    r = _client(server, token).post("/v1/tokens", json={"role": role, "label": label})
    _fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))


@tokens_app.command("list")
def tokens_list(server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN")) -> None:
    """List tokens (never their secrets)."""
    r = _client(server, token).get("/v1/tokens", params={"limit": 500})
    _fail_on_problem(r)
    for t in r.json()["items"]:
        typer.echo(f"{t['id']:>5}  {t['role']:<9} {t['node'] or '-':<20} {'revoked' if t['revoked_at'] else 'active':<8} "
                   f"{t['label'] or ''}")


@tokens_app.command("revoke")
def tokens_revoke(token_id: int, server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN")) -> None:
    """Revoke a token."""
    r = _client(server, token).post(f"/v1/tokens/{token_id}/revoke")
    _fail_on_problem(r)
    typer.echo(json.dumps(r.json()))


@tokens_app.command("rotate")
def tokens_rotate(token_id: int, server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN")) -> None:
    """Revoke a token and print its replacement (same role, node, label)."""
    r = _client(server, token).post(f"/v1/tokens/{token_id}/rotate")
    _fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
