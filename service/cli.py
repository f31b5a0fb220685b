"""The ``preflight`` command line (Typer): serve, migrate, check, manifest push, agent run/verify, keys, audit."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import sys
import time
import types
from typing import Optional

import typer

app = typer.Typer(help="Preflight: validate, sign and audit vLLM launch configurations.", no_args_is_help=True, rich_markup_mode="markdown")
manifest_app = typer.Typer(help="Weight manifests.", no_args_is_help=True, rich_markup_mode="markdown")
agent_app = typer.Typer(help="The GPU node bootstrap agent.", no_args_is_help=True, rich_markup_mode="markdown")
keys_app = typer.Typer(help="Signing keys.", no_args_is_help=True, rich_markup_mode="markdown")
audit_app = typer.Typer(help="The audit log.", no_args_is_help=True, rich_markup_mode="markdown")
tune_app = typer.Typer(help="The tuning loop: from vLLM's live metrics to the next plan (docs/operating.md §9).",
                       no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(manifest_app, name="manifest")
app.add_typer(agent_app, name="agent")
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")
rollout_app = typer.Typer(help="Staged rollouts: a launch config changed over nodes in waves.",
                          no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(rollout_app, name="rollout")
app.add_typer(tune_app, name="tune")


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
    typer.echo(f"Preflight on http://{host}:{port}  (fleet page: http://{host}:{port}/ui/, API docs: "
               f"http://{host}:{port}/docs)")
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
        pre = d / "preprocessor_config.json"  # image limits of a multimodal model (the encoder's memory profile)
        if model.get("preprocessor_config") is None and pre.is_file():
            model["preprocessor_config"] = json.loads(pre.read_text())
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
                      else [exc.as_dict()] if isinstance(exc, DomainError)
                      else [{"field": "file", "rule": "unreadable" if isinstance(exc, OSError) else "invalid_json",
                             "message": str(exc)}])
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
        typer.echo(f"preflight: HTTP {r.status_code}: {_problem_text(r)}", err=True)
        raise typer.Exit(1)


def _problem_text(r) -> str:
    """A problem+json answer as a person reads it: the detail, then each field error and finding on its own line
    (control characters escaped: the text comes from the server); anything else as sent, cut at 2,000 characters."""
    try:
        body = r.json()
    except ValueError:
        return _printable(r.text[:2000])
    if not isinstance(body, dict) or not isinstance(body.get("detail") or body.get("title"), str):
        return _printable(r.text[:2000])
    lines = [str(body.get("detail") or body.get("title"))]
    for e in (body.get("errors") or [])[:20]:
        if isinstance(e, dict):
            lines.append(f"  {e.get('field', '')}: {e.get('message', '')}")
    for f in (body.get("findings") or [])[:20]:
        if isinstance(f, dict) and f.get("severity") == "error":
            lines.append(f"  [{f.get('rule', '')}] {f.get('message', '')}")
    return _printable("\n".join(lines))


def _printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with control and format characters (bidi overrides among them) escaped, never written raw to an
    operator's terminal; the characters in ``keep`` (newlines and tabs) stay."""
    import unicodedata

    return "".join(c if c in keep or unicodedata.category(c) not in ("Cc", "Cf") else
                   c.encode("unicode_escape").decode("ascii") for c in text)


@manifest_app.command("push")
def manifest_push(directory: pathlib.Path = typer.Argument(..., help="Model directory holding config.json."),
                  server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                  token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
                  name: Optional[str] = typer.Option(None, help="Manifest name (default: the directory name)."),
                  version: str = typer.Option("1", help="Manifest version."),
                  uri: Optional[str] = typer.Option(None, help="Where nodes load the weights (default: the path)."),
                  tp_sharded: Optional[int] = typer.Option(None, help="Checkpoint saved per rank at this TP."),
                  hash_shards: bool = typer.Option(False, "--hash-shards",
                                                   help="Also record each shard's SHA-256 (reads every shard: tens "
                                                        "of GB; nodes verify them with --verify-hashes).")) -> None:
    """Register a model directory as a manifest, with what the launch depends on in it: config.json's SHA-256, the
    quantization tag, hf_quant_config.json, the safetensors index's shards and sizes (nodes check them at boot)."""
    from .agent.weights import WeightsError

    try:  # the directory read as hostile first (no FIFO, no symlink out of it, bounded), then its JSON files
        files = _describe_weights(directory, hash_shards)
        body = {**read_model_dir(directory), "files": files}
    except (OSError, ValueError, RecursionError, WeightsError) as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    body.update(name=name or directory.name, version=version, uri=uri or str(directory.resolve()),
                checkpoint={"layout": "tp_sharded", "tensor_parallel_size": tp_sharded} if tp_sharded
                else {"layout": "merged"})
    r = _client(server, token).post("/v1/manifests", json=body)
    _fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))


def _print_tuning(out: dict) -> None:
    typer.echo(f"{out.get('node')}: {out.get('state')} ({out.get('action')}); plan {out.get('plan')}")
    cur = out.get("current", {}).get("engine_args", {})
    typer.echo(f"  current: max_num_seqs {cur.get('max_num_seqs')}, gpu_memory_utilization "
               f"{cur.get('gpu_memory_utilization')}")
    nxt = out.get("next")
    typer.echo(f"  next:    max_num_seqs {nxt['max_num_seqs']}, gpu_memory_utilization "
               f"{nxt['gpu_memory_utilization']}" if nxt else "  next:    keep the current plan")
    for reason in out.get("reasons", []):
        typer.echo(f"  - {reason}")
    ids = [w["id"] for w in out.get("evidence", [])]
    if ids:
        typer.echo(f"  windows: {ids}")


@tune_app.command("status")
def tune_status(node: str = typer.Argument(..., help="The node."),
                server: str = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL."),
                token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A reader's token (admin, deployer, "
                                                                                "auditor)."),
                as_json: bool = typer.Option(False, "--json", help="The API's answer as JSON.")) -> None:
    """The tuning loop's state for the node's current plan: what it proposes next, why, and from which windows."""
    r = _client(server, token).get(f"/v1/nodes/{node}/tuning")
    _fail_on_problem(r)
    if as_json:
        typer.echo(json.dumps(r.json(), indent=2))
    else:
        _print_tuning(r.json())


@tune_app.command("apply")
def tune_apply(node: str = typer.Argument(..., help="The node."),
               server: str = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL."),
               token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A deployer's or admin's token.")) -> None:
    """Create the loop's next plan for the node (validated, signed, audited, superseding the current one). Exit 3
    when the loop proposes nothing now (HTTP 409)."""
    r = _client(server, token).post(f"/v1/nodes/{node}/tuning/apply")
    if r.status_code == 409:
        typer.echo(f"preflight tune: nothing to apply: {r.json().get('detail', r.text)}", err=True)
        raise typer.Exit(3)
    _fail_on_problem(r)
    out = r.json()
    t = out.get("tuning", {})
    typer.echo(f"plan {out['id']} ({t.get('action')}, from {t.get('from')}): {out['command']}")


def _describe_weights(directory: pathlib.Path, hash_shards: bool) -> dict:
    """agent/weights.py's record of the directory; with hashing, a progress bar over the shards' bytes."""
    from .agent.weights import describe

    if not hash_shards:
        return describe(directory)
    total = sum(s["size"] for s in describe(directory)["shards"])
    with typer.progressbar(length=total, label="hashing shards", file=sys.stderr) as bar:
        return describe(directory, hash_shards=True, on_bytes=bar.update)


EXIT_REFUSED = 3  # a check failed: nothing ran, the state is unchanged
EXIT_UNAVAILABLE = 75  # EX_TEMPFAIL: the service cannot be reached and no offline boot applies (systemd retries)
STALE_NO_STATE_SECONDS = 120  # without state, only a freshness statement signed this recently is accepted


class Reporter:
    """The agent's reports about one plan (or none): each carries the run id and, after an offline boot, says so.
    Reports the service cannot take yet are queued (kept in the state file at exit) and sent, in order, as soon as
    it answers again. Calling it sends at once; ``enqueue`` (used while vLLM runs) hands the report to a sender
    thread, so reading vLLM's output never waits on the network (a full pipe would stall vLLM)."""

    def __init__(self, client, state, *, plan_id: str | None, seq: int | None, offline: dict | None = None,
                 send_pending: bool = False, placement: dict | None = None):
        import threading
        import uuid

        self.client, self.state, self.plan_id, self.seq, self.offline = client, state, plan_id, seq, offline
        self.placement = placement  # group, rank, role of a node in a plan with placement claims
        self.audit_checkpoint: dict | None = None  # what the node witnessed of the audit log (agent/witness.py)
        self.run_id = str(uuid.uuid4())
        self.send_lock = threading.Lock()  # one sender at a time: reports stay in order
        self.cv = threading.Condition()
        self.sender: threading.Thread | None = None
        self.closing = False
        # reports queued by an earlier (offline) boot go only to a service that has just proved itself genuine
        self.queue: list[dict] = [q for q in state.pending if isinstance(q, dict)][-200:] if send_pending else []

    def _body(self, status: str, message: str | None, details: dict | None) -> dict:
        body_details = {**(details or {}), "run_id": self.run_id, "at": round(time.time(), 3)}
        if self.seq is not None:
            body_details["seq"] = self.seq
        if self.placement:
            body_details.update(self.placement)
        if self.offline:
            body_details["offline_boot"] = self.offline
        if self.audit_checkpoint is not None:  # carried by the first report of this boot
            body_details["audit_checkpoint"], self.audit_checkpoint = self.audit_checkpoint, None
        return {"plan_id": self.plan_id, "status": status, "message": message, "details": body_details}

    def __call__(self, status: str, message: str | None = None, details: dict | None = None) -> None:
        with self.cv:
            self.queue.append(self._body(status, message, details))
        self.flush()

    def enqueue(self, status: str, message: str | None = None, details: dict | None = None) -> None:
        import threading

        with self.cv:
            self.queue.append(self._body(status, message, details))
            if self.sender is None:
                self.sender = threading.Thread(target=self._send_loop, name="preflight-reports", daemon=True)
                self.sender.start()
            self.cv.notify()

    def _send_loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closing:
                    self.cv.wait()
                if self.closing:
                    return
            if not self.flush():
                with self.cv:
                    if not self.closing:
                        self.cv.wait(5.0)  # the service is away: try again later (or at the next report)

    def flush(self) -> bool:
        """Send what is queued, in order. False when the service cannot take it now."""
        import httpx

        with self.send_lock:
            while True:
                with self.cv:
                    if not self.queue:
                        return True
                    body = self.queue[0]
                try:
                    r = self.client.post_report(body)
                except httpx.HTTPError:
                    return False
                if r.status_code >= 500 or r.status_code == 429:
                    return False
                if r.status_code >= 400:
                    typer.echo(f"preflight agent: the service refused a {body['status']} report: "
                               f"HTTP {r.status_code}", err=True)
                with self.cv:
                    self.queue.pop(0)

    def heartbeat(self) -> bool | None:
        """Heartbeats are not queued: only the latest matters. Returns the service's ``current`` (False: the plan
        was superseded or revoked), None without an answer."""
        import httpx

        if not self.flush():
            return None
        try:
            r = self.client.post_report({"plan_id": self.plan_id, "status": "heartbeat", "message": None,
                                         "details": {"run_id": self.run_id}})
            body = r.json() if r.status_code == 201 else None
        except (httpx.HTTPError, ValueError, RecursionError):
            return None
        return False if isinstance(body, dict) and body.get("current") is False else None

    def close(self) -> None:
        """Stop the sender, try once more, and keep what could not be sent in the state file (the next boot sends
        it)."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        if self.sender is not None:
            self.sender.join(60)
        self.flush()
        self.keep_undelivered()

    def keep_undelivered(self) -> None:
        with self.cv:
            pending = list(self.queue)[-200:]
        if pending != self.state.pending:
            self.state.pending = pending
            self.state.save()


def _agent_token(token: str | None, token_file: pathlib.Path | None) -> str:
    """--token as given, or the token in --token-file (a link is followed: a mounted Secret), only a regular file,
    at most 4 KiB, and only a token of the service's shape (agent/files.py)."""
    from .agent.files import UnsafeFile, read_token_file

    if token:
        return token
    if token_file is None:
        typer.echo("preflight agent: give --token or --token-file (PREFLIGHT_TOKEN / PREFLIGHT_TOKEN_FILE)", err=True)
        raise typer.Exit(2)
    try:
        return read_token_file(token_file)
    except FileNotFoundError:
        typer.echo(f"preflight agent: the token file {token_file} does not exist (run `preflight agent register`)",
                   err=True)
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
        typer.echo("preflight agent: no vllm executable: install vLLM on the agent's PATH or name it with --vllm PATH",
                   err=True)
        raise typer.Exit(2)
    return os.path.abspath(path)


def _load_trust(trust: pathlib.Path):
    from .agent.trust import Trust, TrustError

    try:
        return Trust.load(trust)
    except TrustError as exc:
        typer.echo(f"preflight agent: {exc}", err=True)
        raise typer.Exit(2)


@agent_app.command("run")
def agent_run(server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
              node: str = typer.Option(..., envvar="PREFLIGHT_NODE"),
              token: Optional[str] = typer.Option(None, envvar="PREFLIGHT_TOKEN"),
              token_file: Optional[pathlib.Path] = typer.Option(
                  None, envvar="PREFLIGHT_TOKEN_FILE", help="Read the agent token from this file (as `preflight "
                  "agent register --token-file` wrote it) instead of --token."),
              trust: pathlib.Path = typer.Option(..., envvar="PREFLIGHT_TRUST",
                                                 help="The node's trust root: a JWKS file installed at provisioning "
                                                      "(saved /.well-known/jwks.json or `preflight keys export`). "
                                                      "Updated only through the service's signed key-set chain."),
              state: Optional[pathlib.Path] = typer.Option(None, help="State file (default ~/.preflight/agent-NODE.json)."),
              print_only: bool = typer.Option(True, "--print/--exec",
                                              help="Print the command, or run it (the agent supervises it and "
                                                   "reports started / running / heartbeat / stopped / exited)."),
              wait: bool = typer.Option(False, "--wait", help="Wait while the node has no plan yet, or while the "
                                        "service is unreachable and no offline boot applies."),
              poll_seconds: float = typer.Option(30.0, help="Seconds between attempts with --wait."),
              vllm: Optional[str] = typer.Option(None, envvar="PREFLIGHT_VLLM",
                                                 help="The vllm executable this node runs (default: the first vllm "
                                                      "on the agent's PATH at start). A plan never chooses it."),
              offline_max_age: float = typer.Option(7 * 86400, envvar="PREFLIGHT_OFFLINE_MAX_AGE",
                                                    help="When the service is unreachable at boot, run the last "
                                                         "verified plan if the service confirmed it current at most "
                                                         "this many seconds ago (0: never)."),
              heartbeat_seconds: float = typer.Option(60.0, envvar="PREFLIGHT_HEARTBEAT_SECONDS",
                                                      help="Seconds between heartbeat reports while vLLM runs."),
              group_wait: float = typer.Option(
                  600.0, envvar="PREFLIGHT_GROUP_WAIT",
                  help="A worker of a multi-node group waits this many seconds for its head to start the same plan "
                       "(the service withholds the plan until then), then exits 75 (with --wait: no limit)."),
              issuer: str = typer.Option("preflight", envvar="PREFLIGHT_ISSUER", help="The iss plans must carry."),
              audience: str = typer.Option("preflight-agent", envvar="PREFLIGHT_AUDIENCE",
                                           help="The aud plans must carry."),
              audit_copy: Optional[pathlib.Path] = typer.Option(
                  None, envvar="PREFLIGHT_AUDIT_COPY",
                  help="Where the node keeps the longest signed audit checkpoint it has seen (default: next to the "
                       "state file, STATE.checkpoint.jws); a shorter or rewritten chain later is reported."),
              nvidia_smi: str = typer.Option("nvidia-smi", envvar="PREFLIGHT_NVIDIA_SMI",
                                             help="nvidia-smi, read before vLLM starts (GPUs, free memory)."),
              weights_root: Optional[pathlib.Path] = typer.Option(
                  None, envvar="PREFLIGHT_WEIGHTS_ROOT",
                  help="Where this node keeps weights of remote models: s3://bucket/llama is checked in "
                       "ROOT/bucket/llama (a local path uri is checked where it is)."),
              verify_hashes: bool = typer.Option(False, "--verify-hashes", envvar="PREFLIGHT_VERIFY_HASHES",
                                                 help="Also hash every shard the manifest recorded a SHA-256 for "
                                                      "(reads all the weights at every boot)."),
              metrics_seconds: float = typer.Option(60.0, envvar="PREFLIGHT_METRICS_SECONDS", min=0, max=3600,
                                                    help="With --exec: sample vLLM's /metrics every N seconds and "
                                                         "post each window for the tuning loop (0: off)."),
              metrics_url: Optional[str] = typer.Option(None, envvar="PREFLIGHT_METRICS_URL",
                                                        help="vLLM's Prometheus endpoint (default: "
                                                             "http://127.0.0.1:PORT/metrics, PORT from the plan's "
                                                             "--port, else 8000).")) -> None:
    """Boot this node's current plan: verify it, check the node, then print or run it.

    Fetch the plan with a fresh freshness statement, verify both against the pinned trust root, save it, then print
    or run exactly its argv with the node's vllm (with --exec, after the GPU, weights and free-memory checks). Every
    start runs the current plan again (after a reboot, a crash or a restart); a plan older than the last one
    accepted never runs."""
    import datetime as dt

    import httpx

    from .agent.client import AgentClient, AgentState, ResponseTooLarge, StateCorrupt
    from .agent.verify import VerificationError, verify_freshness, verify_plan

    boot = time.time()
    token = _agent_token(token, token_file)
    s = types.SimpleNamespace(issuer=issuer, audience=audience)
    tr = _load_trust(trust)
    vllm_path = None if print_only else _resolve_vllm(vllm)
    client = AgentClient(server, node, token)
    state_path = state or pathlib.Path.home() / ".preflight" / f"agent-{node}.json"
    checkpoint_copy = audit_copy or state_path.with_suffix(".checkpoint.jws")
    lost = None
    try:
        st = AgentState.load(state_path)
    except StateCorrupt as exc:
        aside = AgentState(path=state_path).set_aside()
        lost = f"state file unusable ({exc}); set aside as {aside}"
        typer.echo(f"preflight agent: {lost}. Starting from an empty state: only a plan the service confirms "
                   f"current right now may run, and no offline boot.", err=True)
        st = AgentState(path=state_path)
    fresh_state = st.last_seq == 0  # a new node or a lost state: accept only a statement made just now

    def refuse(plan_id: str | None, exc: VerificationError, check: str) -> None:
        typer.echo(f"preflight agent: REFUSED {check}{' ' + plan_id if plan_id else ''}: {exc}", err=True)
        Reporter(client, st, plan_id=plan_id, seq=None)("refused", f"{check} refused: {exc}",
                                                        {"reason": exc.reason, "check": check})

    # 1. the trust root: apply the key sets the service publishes above the pinned version, each signed by a key
    #    trusted at that point; a key set that does not chain is refused and the trust file stays as it was
    def update_trust() -> bool:
        """False when the service cannot be reached."""
        try:
            try:
                statements = client.keysets(tr.version)
            except ResponseTooLarge as exc:
                raise VerificationError("keyset_too_large", str(exc)) from None
            applied = tr.apply_chain(statements)
            if applied:
                typer.echo(f"preflight agent: trust root updated to key set version {applied[-1]}", err=True)
        except VerificationError as exc:
            refuse(None, exc, "key set")
        except httpx.HTTPError:
            return False
        return True

    def keep_audit_checkpoint():
        """The node keeps the longest audit checkpoint it has seen (agent/witness.py) and says when the service's
        chain got shorter or was rewritten. Never in the way of the boot."""
        from .agent.witness import witness

        try:
            served = client.audit_checkpoint()
        except (httpx.HTTPError, ResponseTooLarge):
            return None
        if served is None:
            return None
        try:
            w = witness(checkpoint_copy, served, tr.jwks)
        except OSError as exc:
            typer.echo(f"preflight agent: could not keep the audit checkpoint in {checkpoint_copy}: {exc}", err=True)
            return None
        if w.status in ("cut", "rewritten"):
            typer.echo(f"preflight agent: AUDIT ALARM: {w.message} (copy kept in {checkpoint_copy}; check the "
                       f"database with `preflight audit verify --checkpoint {checkpoint_copy}`)", err=True)
        elif w.status == "ignored":
            typer.echo(f"preflight agent: {w.message}", err=True)
        return w

    reachable = update_trust()
    witnessed = keep_audit_checkpoint() if reachable else None
    if lost:
        Reporter(client, st, plan_id=None, seq=None)("reset", "agent state reset: " + lost,
                                                     {"reason": "state_corrupt"})

    # 2. the node's current plan, with a freshness statement signed by the service at fetch time
    said = None
    held_since, hold_delay = None, 1.0
    while True:
        try:
            r = client.fetch(st.etag if st.plan else None) if reachable or wait else None
        except httpx.HTTPError:
            r = None
        except ResponseTooLarge as exc:
            refuse(None, VerificationError("too_large", str(exc)), "plan")
            raise typer.Exit(EXIT_REFUSED)
        hold = _group_hold(r)
        if hold is not None:  # a worker whose head does not run this plan yet (domain/group_gate.py): no start
            held_since = time.monotonic() if held_since is None else held_since
            waited = time.monotonic() - held_since
            if hold["final"] and not wait:
                typer.echo(f"preflight agent: REFUSED group {hold['plan_id']}: {hold['message']}. vLLM was not "
                           f"started.", err=True)
                Reporter(client, st, plan_id=hold["plan_id"], seq=None)(
                    "refused", f"group refused: {hold['message']}",
                    {"reason": hold["reason"], "check": "group", "head": hold["head"],
                     "head_report": hold["head_report"]})
                raise typer.Exit(EXIT_REFUSED)
            if not wait and waited >= group_wait:
                typer.echo(f"preflight agent: gave up after {int(waited)} s (--group-wait {int(group_wait)}): "
                           f"{hold['message']}. vLLM was not started.", err=True)
                raise typer.Exit(EXIT_UNAVAILABLE)
            if said != ("hold", hold["reason"], hold["head_report"]):
                typer.echo(f"preflight agent: HOLD {hold['plan_id']}: {hold['message']}"
                           f"{'' if wait else f' (at most {int(group_wait)} s, --group-wait)'}", err=True)
                said = ("hold", hold["reason"], hold["head_report"])
            time.sleep(min(hold_delay, hold["retry_after"]) if wait else
                       max(0.0, min(hold_delay, hold["retry_after"], group_wait - waited)))
            hold_delay *= 1.5
            continue
        if r is not None and r.status_code < 500 and r.status_code != 429:
            if r.status_code == 404 and "has no current plan" in r.text and st.verified_at is not None:
                # the service says the saved plan is not current (revoked): it may no longer boot offline
                st.verified_at = None
                st.save()
            if r.status_code == 404 and wait and "has no current plan" in r.text:
                if said != 404:
                    typer.echo(f"preflight agent: {node} has no plan yet; waiting", err=True)
                    said = 404
                time.sleep(poll_seconds)
                continue
            break
        # the service cannot be reached (or fails): the last verified plan, if recent enough
        age = boot - st.verified_at if st.verified_at else None
        may_boot = bool(st.plan and not lost and offline_max_age > 0 and age is not None
                        and -300 <= age <= offline_max_age)
        if may_boot and not (wait and _group_member(st.plan)):  # a group member is refused offline (below)
            break
        why = ("the saved plan is a multi-node group member's, which never boots offline" if may_boot else
               "no verified plan is saved" if not st.plan else "offline boot is disabled (--offline-max-age 0)"
               if offline_max_age <= 0 else f"the saved plan was last confirmed {int(age or 0)} s ago, more than "
               f"--offline-max-age {int(offline_max_age)} s")
        if not wait:
            typer.echo(f"preflight agent: the service is unreachable"
                       f"{f' (HTTP {r.status_code})' if r is not None else ''} and {why}: nothing runs", err=True)
            raise typer.Exit(EXIT_UNAVAILABLE)
        if said != "offline":
            typer.echo(f"preflight agent: the service is unreachable and {why}; waiting", err=True)
            said = "offline"
        time.sleep(poll_seconds)
        reachable = update_trust()

    offline = None
    if r is None or r.status_code >= 500 or r.status_code == 429:
        plan_token, header_id = st.plan, st.plan_id
        offline = {"plan_verified_at": dt.datetime.fromtimestamp(st.verified_at, dt.timezone.utc).isoformat(),
                   "age_seconds": int(boot - st.verified_at)}
    elif r.status_code == 304 and st.plan:
        plan_token, header_id = st.plan, st.plan_id
    elif r.status_code == 200:
        header_id = r.headers.get("X-Plan-Id") or None
        plan_token, header_id = r.text, header_id if header_id and len(header_id) <= 36 else None  # unverified
    elif r.status_code == 404 and "has no current plan" in r.text:
        typer.echo(f"preflight agent: {node} has no current plan: nothing runs (--wait waits for one)", err=True)
        raise typer.Exit(1)
    else:
        detail = r.text[:500]
        try:
            body = r.json()
            detail = str(body.get("detail", detail))[:500] if isinstance(body, dict) else detail
        except (ValueError, RecursionError):
            pass
        typer.echo(f"preflight agent: fetch failed: HTTP {r.status_code}: {detail}", err=True)
        raise typer.Exit(1)

    try:
        plan = verify_plan(plan_token, tr.jwks, node=node, audience=s.audience, issuer=s.issuer,
                           last_seq=st.last_seq, last_plan_id=st.plan_id)
    except VerificationError as exc:
        refuse(header_id, exc, "plan")
        raise typer.Exit(EXIT_REFUSED)
    if offline is None:
        try:
            fresh = verify_freshness(r.headers.get("X-Plan-Freshness", ""), tr.jwks, plan_token=plan_token,
                                     plan=plan, node=node, audience=s.audience, issuer=s.issuer,
                                     not_before=boot - STALE_NO_STATE_SECONDS if fresh_state else None)
        except VerificationError as exc:
            refuse(plan.claims["jti"], exc, "freshness")
            raise typer.Exit(EXIT_REFUSED)
        new = r.status_code == 200
        # the plan was confirmed current when the service signed the statement, not when this node read it: a
        # statement replayed near its expiry must not restart the offline-boot clock
        st.last_seq, st.plan_id, st.plan = plan.seq, plan.claims["jti"], plan_token
        st.verified_at = float(max(0, min(time.time(), fresh["iat"])))
        st.etag = r.headers.get("ETag") or st.etag
        st.save()
    else:
        new = False
    placement = {k: plan.claims[k] for k in ("group", "rank", "role") if k in plan.claims}
    if offline is not None and plan.grouped:
        # the freshness statement is what says the head holds the same group plan: without it, no start
        refuse(plan.claims["jti"], VerificationError(
            "group_offline", f"the service is unreachable and this node is the {plan.role} (rank {plan.claims['rank']}) of a "
            f"{plan.claims['nnodes']}-node group: it boots only with the service's word that its head holds the same "
            f"group plan, never offline"), "freshness")
        raise typer.Exit(EXIT_UNAVAILABLE)
    if offline is not None:  # said once the saved plan verified and may boot offline (never before a refusal)
        typer.echo(f"preflight agent: the service is unreachable: OFFLINE BOOT of the last verified plan "
                   f"{st.plan_id} (seq {st.last_seq}, confirmed current {offline['age_seconds']} s ago)", err=True)
    report = Reporter(client, st, plan_id=plan.claims["jti"], seq=plan.seq, offline=offline, send_pending=True,
                      placement=placement)
    if witnessed is not None:
        report.audit_checkpoint = witnessed.details()
    if new:
        report("fetched", f"verified seq {plan.seq} with key {plan.kid}")
    env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.claims["env"].items()))
    if print_only:
        command = (env_line + " " if env_line else "") + shlex.join(plan.argv)
        typer.echo(command)
        report.flush()  # the service answered: what an offline boot queued is delivered now, not at the next --exec
        report.keep_undelivered()
        raise typer.Exit(0)
    if not _node_checks_pass(client, report, plan.claims, node=node, nvidia_smi=nvidia_smi,
                             weights_root=weights_root, verify_hashes=verify_hashes):
        report.close()
        raise typer.Exit(EXIT_REFUSED)
    from .agent import runner

    argv = [vllm_path, *plan.argv[1:]]  # the node's vllm, never one a plan or its env chooses
    where = (f" as the {plan.role} (rank {plan.claims['rank']} of {plan.claims['nnodes']}, group "
             f"{plan.claims['group']}, head {plan.claims['head']})" if plan.grouped else "")
    typer.echo(f"preflight agent: running plan {plan.claims['jti']} (seq {plan.seq}){where} with {vllm_path}",
               err=True)
    # the agent's own settings (its token among them) never reach vLLM or the model code it may run
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}, **plan.claims["env"]}
    sampler = None
    # issue 16: windows of vLLM's live metrics for the tuning loop (best effort); a headless worker of a multi-node
    # instance serves no API and no /metrics — its head does
    if metrics_seconds > 0 and plan.role != "worker":
        from .agent.vllm_metrics import Sampler, metrics_url as default_metrics_url

        sampler = Sampler(metrics_url or default_metrics_url(plan.argv), plan.claims["jti"], client.post_metrics,
                          seconds=metrics_seconds).start()
    try:
        code = runner.run(argv, env, report.enqueue, heartbeat_seconds=heartbeat_seconds,
                          heartbeat=report.heartbeat)
    finally:
        if sampler is not None:
            sampler.stop()
        report.close()
    if code == runner.SUPERSEDED:  # a new plan (or none): boot again, the same way a restart would
        typer.echo("preflight agent: the plan is no longer current; booting again", err=True)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "service.cli", *sys.argv[1:]])
    raise typer.Exit(code)


def _group_member(token: str) -> bool:
    """Whether a saved plan (verified when saved; only read here, to choose to wait) is a multi-node group member's:
    with --wait such a node waits for the service instead of going to an offline boot it would refuse."""
    from .signing import b64json

    try:
        claims = b64json(token.split(".")[1])
    except (ValueError, IndexError, RecursionError, UnicodeDecodeError):
        return False
    return isinstance(claims, dict) and claims.get("role") in ("head", "worker")


def _group_hold(r) -> dict | None:
    """The service's 409 ``group-hold`` answer (api/app.py), read defensively: reason, message (printable, bounded),
    final, head, head_report, plan_id and the Retry-After seconds (1..30). None for any other answer."""
    if r is None or r.status_code != 409:
        return None
    try:
        body = r.json()
    except (ValueError, RecursionError):
        return None
    hold = body.get("hold") if isinstance(body, dict) else None
    if not isinstance(hold, dict) or not str(body.get("type", "")).endswith("/group-hold"):
        return None

    def text_of(v, n=300):
        return "".join(ch if ch.isprintable() else "?" for ch in str(v))[:n] if v is not None else None

    try:
        retry = min(30.0, max(1.0, float(r.headers.get("Retry-After", "5"))))
    except ValueError:
        retry = 5.0
    return {"reason": text_of(hold.get("reason"), 40), "message": text_of(hold.get("message")),
            "final": hold.get("final") is True, "head": text_of(hold.get("head"), 128),
            "head_report": text_of(hold.get("head_report"), 16), "plan_id": text_of(hold.get("plan_id"), 36),
            "retry_after": retry}


def _node_checks_pass(client, report, claims: dict, *, node: str, nvidia_smi: str,
                      weights_root: Optional[pathlib.Path], verify_hashes: bool) -> bool:
    """Issue 17: the GPUs, the weights and the free memory the plan needs (agent/bootcheck.py). A refusal is
    reported (``refused``, details.check/reason and the numbers) and printed; after inventory drift the node's facts
    are updated with what nvidia-smi shows (PUT /v1/nodes/NAME/facts, the agent's own node only)."""
    import httpx

    from .agent.bootcheck import run_checks

    def say(line: str) -> None:
        typer.echo(f"preflight agent: {line}", err=True)

    from .agent.bootcheck import Refusal

    try:
        refusal = run_checks(claims, nvidia_smi=nvidia_smi, weights_root=weights_root, verify_hashes=verify_hashes,
                             say=say)
    except Exception as exc:  # whatever a node's tools or disk hand back, a check that cannot finish refuses
        refusal = Refusal("node checks", "check_failed",
                          f"a check could not be completed ({exc.__class__.__name__}: {str(exc)[:200]})")
    state = report.state

    def put_facts(facts: dict, done: str) -> bool:
        try:
            r = client.http.put(f"/v1/nodes/{node}/facts", json=facts)
        except httpx.HTTPError as exc:
            say(f"could not update the node's facts: {exc}")
            return False
        if r.status_code >= 400:
            say(f"could not update the node's facts: HTTP {r.status_code}: {_printable(r.text[:300])}")
            return False
        say(done)
        return True

    if refusal is None:
        if state.facts_drifted:  # an earlier boot sent drifted facts; the GPUs agree with the plan again
            from .agent.gpus import NvidiaSmiError, node_facts, read_gpus, read_interconnect_quietly

            try:
                gpus = read_gpus(nvidia_smi)
                facts = node_facts(gpus, read_interconnect_quietly(nvidia_smi, len(gpus)))
            except (NvidiaSmiError, OSError) as exc:
                say(f"could not read the GPUs again to restore the node's facts: {exc}")
            else:
                if put_facts(facts, "the GPUs are back: the node's facts are updated with what nvidia-smi shows"):
                    state.facts_drifted = False
                    state.save()
        return True
    typer.echo(f"preflight agent: REFUSED {refusal.check} {claims['jti']}: {refusal.message}. vLLM was not "
               f"started.", err=True)
    report("refused", f"{refusal.check} refused: {refusal.message}",
           {"reason": refusal.reason, "check": refusal.check, **refusal.details})
    if refusal.observed_facts is not None and put_facts(
            refusal.observed_facts, "the node's facts are updated with what nvidia-smi shows: a new plan is needed"):
        state.facts_drifted = True
        state.save()
    return False


@agent_app.command("register")
def agent_register(server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                   node: str = typer.Option(..., envvar="PREFLIGHT_NODE", help="This node's name."),
                   enroll_token: str = typer.Option(..., envvar="PREFLIGHT_ENROLL_TOKEN",
                                                    help="An enroller token (or an admin's)."),
                   token_file: pathlib.Path = typer.Option(..., help="Where the node's agent token is written "
                                                           "(mode 0600, atomically); shown nowhere else."),
                   address: Optional[str] = typer.Option(None, help="IP address or DNS name the other nodes of a multi-node instance reach this node at."),
                   nvidia_smi: str = typer.Option("nvidia-smi", envvar="PREFLIGHT_NVIDIA_SMI"),
                   rotate_token: bool = typer.Option(False, "--rotate-token",
                                                     help="Issue a new agent token even when TOKEN_FILE holds one "
                                                          "(the node's other tokens are revoked).")) -> None:
    """Register this node (or update its facts) from what nvidia-smi reads, with an enrollment token.

    The facts: GPU model, count, memory, compute capability, NVLink or PCIe. Safe to re-run: while TOKEN_FILE holds
    the node's live agent token, the facts are sent with it and it is kept; otherwise (a new or re-imaged node, a
    revoked token) the enrollment token registers or updates the node and a new agent token is issued, the node's
    old ones revoked. TOKEN_FILE must not be a symlink (register writes it)."""
    import httpx

    from .agent.files import UnsafeFile, read_token_file
    from .agent.gpus import NvidiaSmiError, mixed_models, node_facts, read_gpus, read_interconnect
    from .agent.trust import write_text_atomic

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
    if token_file.is_symlink():  # register writes this file: a link is never replaced behind the operator's back
        typer.echo(f"preflight agent register: the token file {token_file} is a symlink: refused (register writes "
                   f"the token file; name the file itself): nothing changed", err=True)
        raise typer.Exit(2)
    try:
        kept = read_token_file(token_file)
    except FileNotFoundError:
        kept = ""
    except UnsafeFile:
        kept = ""  # not a token (a corrupted file) or not a regular file: enrol again (a directory fails below)
    except OSError:
        kept = ""
    # the new token must be writable before the service rotates anything (a failed write would lock the node out)
    try:
        token_file.parent.mkdir(parents=True, exist_ok=True)
        if token_file.is_dir() or (token_file.exists() and not os.access(token_file.parent, os.W_OK)) \
                or not os.access(token_file.parent, os.W_OK):
            raise OSError(f"{token_file} cannot be written")
    except OSError as exc:
        typer.echo(f"preflight agent register: {exc}: nothing changed", err=True)
        raise typer.Exit(2)
    body = {**facts, **({"address": address} if address is not None else {})}  # left out: the stored one stays
    try:
        r = None
        if kept and not rotate_token:  # the kept token proves itself: it may update its own node's facts
            r = _client(server, kept).put(f"/v1/nodes/{node}/facts", json=body)
            if r.status_code == 403:  # a live token of another node: a mistyped --node would take that node over
                typer.echo(f"preflight agent register: the token in {token_file} is live but not {node}'s: refusing "
                           f"to take {node} over (check --node, or pass --rotate-token on purpose)", err=True)
                raise typer.Exit(2)
            if r.status_code == 401:  # revoked: a new one (old ones revoked)
                typer.echo(f"preflight agent register: the token in {token_file} is no longer valid; issuing a new "
                           f"one", err=True)
                r = None
        if r is None:
            r = _client(server, enroll_token).put(f"/v1/nodes/{node}/facts", json={**body, "rotate_token": True})
    except httpx.HTTPError as exc:
        typer.echo(f"preflight agent register: {server}: {exc}", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE)
    _fail_on_problem(r)
    out = r.json()
    secret = out.pop("agent_token", None)
    if secret:
        try:
            write_text_atomic(token_file, secret + "\n")
        except OSError as exc:  # the service already rotated: say where the token went
            typer.echo(f"preflight agent register: the new agent token could not be written to {token_file} "
                       f"({exc}); run again with --rotate-token once the file can be written", err=True)
            raise typer.Exit(2)
    gpu = out["gpu"]
    typer.echo(f"{'registered' if r.status_code == 201 else 'updated'} {node}: {out['gpu_count']} × "
               f"{gpu.get('name')} ({gpu.get('id')}), {gpu.get('memory_bytes', 0) // 2**20} MiB, "
               f"interconnect {out.get('interconnect') or '-'}; agent token "
               f"{'written to ' + str(token_file) if secret else 'kept in ' + str(token_file)}")


@agent_app.command("verify")
def agent_verify(file: pathlib.Path = typer.Argument(..., help="A saved compact JWS plan."),
                 node: str = typer.Option(..., envvar="PREFLIGHT_NODE"),
                 trust: pathlib.Path = typer.Option(..., "--trust", "--jwks", envvar="PREFLIGHT_TRUST",
                                                    help="The node's trust file (a JWKS)."),
                 freshness: Optional[pathlib.Path] = typer.Option(None, help="Also check this saved freshness "
                                                                  "statement (the X-Plan-Freshness header)."),
                 last_seq: int = typer.Option(0, help="Refuse plans below this seq."),
                 issuer: str = typer.Option("preflight", envvar="PREFLIGHT_ISSUER", help="The iss plans must carry."),
                 audience: str = typer.Option("preflight-agent", envvar="PREFLIGHT_AUDIENCE",
                                              help="The aud plans must carry.")) -> None:
    """Verify a saved plan offline against the node's trust file.

    No server is asked anything; with --freshness the saved freshness statement is checked too."""
    from .agent.verify import VerificationError, verify_freshness, verify_plan

    tr = _load_trust(trust)
    s = types.SimpleNamespace(issuer=issuer, audience=audience)
    try:
        token = file.read_text().strip()
        plan = verify_plan(token, tr.jwks, node=node, audience=s.audience, issuer=s.issuer, last_seq=last_seq)
        if freshness:
            verify_freshness(freshness.read_text().strip(), tr.jwks, plan_token=token, plan=plan, node=node,
                             audience=s.audience, issuer=s.issuer)
    except OSError as exc:
        typer.echo(f"INVALID: {exc}", err=True)
        raise typer.Exit(2)
    except VerificationError as exc:
        typer.echo(f"INVALID: {exc}", err=True)
        raise typer.Exit(EXIT_REFUSED)
    typer.echo(json.dumps(plan.claims, indent=2))


@agent_app.command("reset")
def agent_reset(server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
                node: str = typer.Option(..., envvar="PREFLIGHT_NODE"),
                token: Optional[str] = typer.Option(None, envvar="PREFLIGHT_TOKEN"),
                token_file: Optional[pathlib.Path] = typer.Option(
                    None, envvar="PREFLIGHT_TOKEN_FILE", help="Read the agent token from this file (as `preflight "
                    "agent register --token-file` wrote it) instead of --token."),
                state: Optional[pathlib.Path] = typer.Option(None, help="State file (default ~/.preflight/agent-NODE.json)."),
                reason: str = typer.Option(..., help="Why (recorded in the audit).")) -> None:
    """Reset this node's agent state on purpose, recorded in the audit first.

    For a state that holds a seq no genuine plan reaches, say. The reset is first recorded in the service's audit
    (agent.reset, with the state it replaces); without that record nothing changes. The old file is kept beside the
    new one as STATE.reset-<UTC time>."""
    from .agent.client import AgentClient, AgentState, StateCorrupt

    token = _agent_token(token, token_file)
    path = state or pathlib.Path.home() / ".preflight" / f"agent-{node}.json"
    try:
        old = AgentState.load(path)
        previous = {"last_seq": old.last_seq, "plan_id": old.plan_id}
    except StateCorrupt as exc:
        previous = {"unreadable": str(exc)[:500]}
    client = AgentClient(server, node, token)
    if not client.report(None, "reset", f"agent state reset on purpose: {reason}",
                         {"reason": reason[:1000], "previous": previous}):
        typer.echo("preflight agent: the service did not record the reset; the state is unchanged", err=True)
        raise typer.Exit(1)
    if os.path.lexists(path):
        aside = AgentState(path=path).set_aside("reset")
        typer.echo(f"previous state kept as {aside}")
    AgentState(path=path).save()
    typer.echo(f"reset {path} (recorded in the audit as agent.reset)")


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
def keys_retire(kid: str, force: bool = typer.Option(
        False, "--force", help="Retire it even while active plans are signed with it (their nodes stop booting).")
) -> None:
    """Stop publishing a key (plans it signed stop verifying). Refused while active plans are signed with it: reissue
    those first (``POST /v1/plans/{id}/reissue`` signs with the active key)."""
    from sqlalchemy import select

    from .db.models import Assignment
    from .signing import KeyError_, KeyStore, b64json

    if not force:
        in_use: set[str] = set()
        try:
            with _database(_settings()).read() as session:
                for plan_id, signed in session.execute(select(Assignment.plan_id, Assignment.signed)
                                                       .where(Assignment.status == "active")):
                    head = signed.split(".", 1)[0]
                    try:
                        if b64json(head).get("kid") == kid:
                            in_use.add(plan_id)
                    except (ValueError, AttributeError):
                        continue
        except Exception as exc:  # a retirement that cannot be checked is not made by default
            typer.echo(f"preflight: cannot check which active plans are signed with {kid} (database: "
                       f"{exc.__class__.__name__}); run it where PREFLIGHT_DATABASE_URL reaches the service's "
                       f"database, or --force", err=True)
            raise typer.Exit(1)
        if in_use:
            shown = ", ".join(sorted(in_use)[:5]) + (" …" if len(in_use) > 5 else "")
            typer.echo(f"preflight: {len(in_use)} active plan(s) are signed with {kid} ({shown}); their nodes would "
                       f"refuse them at the next boot. Reissue them first (POST /v1/plans/ID/reissue), or --force.",
                       err=True)
            raise typer.Exit(1)
    try:
        KeyStore(_settings().key_dir, create=False).retire(kid)
    except KeyError_ as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    _audit_key_event("key.retired", {"kid": kid})
    typer.echo(f"retired {kid}")


@keys_app.command("export")
def keys_export(out: Optional[pathlib.Path] = typer.Option(None, help="Write here (default: stdout).")) -> None:
    """Write the public key set and its version: a node's trust file (``agent run --trust``), at provisioning."""
    from .agent.trust import write_atomic
    from .signing import KeyStore

    jwks = KeyStore(_settings().key_dir, create=False).jwks()
    if out:
        write_atomic(out, jwks)
        typer.echo(f"wrote key set version {jwks['version']} ({len(jwks['keys'])} keys) to {out}")
    else:
        typer.echo(json.dumps(jwks, indent=2))


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

    try:  # the local key directory: retired keys too (a checkpoint they signed still verifies for an auditor)
        return KeyStore(_settings().key_dir, create=False).audit_jwks()
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
    with _database(s_).read() as s:  # a snapshot: the running service goes on writing
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


@audit_app.command("runs")
def audit_runs(node: str = typer.Option(..., help="The node."),
               at: Optional[str] = typer.Option(None, help="ISO 8601 time: the run(s) in progress then."),
               since: Optional[str] = typer.Option(None, help="ISO 8601 time"),
               until: Optional[str] = typer.Option(None, help="ISO 8601 time"),
               as_json: bool = typer.Option(False, "--json", help="The runs as JSON.")) -> None:
    """Which plan ran on a node at a time (or in a range), read from the database: one line per run. Exit 1 when
    nothing ran then."""
    import datetime as dt

    from .db.session import Database
    from .errors import NotFound
    from .services import history

    def parse(name, value):
        if value is None:
            return None
        try:
            t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            typer.echo(f"preflight: --{name} {value!r} is not an ISO 8601 time", err=True)
            raise typer.Exit(2)
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)

    if at and (since or until):
        typer.echo("preflight: give either --at or --since/--until", err=True)
        raise typer.Exit(2)
    t = parse("at", at)
    lo, hi = (t, t + dt.timedelta(microseconds=1)) if t else (parse("since", since), parse("until", until))
    try:
        with Database(_settings().resolved_database_url).transaction() as s:
            out = history.node_runs(s, node, since=lo, until=hi)
    except NotFound as exc:
        typer.echo(f"preflight: {exc.detail}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for r in out["items"]:
            m = r["manifest"] or {}
            end = (f"{r['ended_at']} ({r['end']}" + (f", status {r['exit_status']}" if r["exit_status"] is not None
                                                    else "") + ")") if r["ended_at"] else \
                f"still running (last heartbeat {r['last_heartbeat_at'] or 'none'})"
            typer.echo(f"{r['started_at']} → {end}  plan {r['plan_id']} seq {r['seq']}  "
                       f"{m.get('name')}@{m.get('version')}  {shlex.join(r['argv'] or [])}")
        if not out["items"]:
            typer.echo(f"nothing ran on {node} {'at ' + at if at else 'in that range'}")
    raise typer.Exit(0 if out["items"] else 1)


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

        jwks = KeyStore(_settings().key_dir, create=False).audit_jwks()  # retired keys too
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
    """Re-validate every active plan against another vLLM version and list what would break.

    Every active plan and every manifest's newest plan. Exit 0 nothing breaks, 1 something breaks, 2 bad input."""
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


tokens_app = typer.Typer(help="Bearer tokens (admin).", no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def tokens_create(role: str = typer.Argument(..., help="admin, deployer, auditor or enroller (creates nodes and updates their hardware facts: `preflight agent register`)"),
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


def _reflow_help(*apps: typer.Typer) -> None:
    """Typer's Rich help keeps a docstring's source line breaks (a ragged run-on block in ``--help`` and in the
    command lists): each paragraph becomes one line, which Rich wraps to the terminal; the first paragraph is what
    the command lists show."""
    import inspect

    for a in apps:
        for info in a.registered_commands:
            doc = info.help or inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())
        _reflow_help(*(g.typer_instance for g in a.registered_groups if g.typer_instance is not None))


def main() -> None:
    """The ``preflight`` command: the CLI, with a service that cannot be reached said in one line (not a
    traceback) and exit status 69 (EX_UNAVAILABLE)."""
    import httpx

    try:
        app()
    except (httpx.TransportError, httpx.InvalidURL) as e:
        reason = str(e) or e.__class__.__name__
        hint = " (give the address with http:// or https://)" if isinstance(e, httpx.UnsupportedProtocol) else ""
        try:
            u = e.request.url
            where = f" at {u.scheme}://{u.netloc.decode('ascii', 'replace')}"
        except (AttributeError, RuntimeError):  # no request was built (an unusable URL)
            where = ""
        typer.echo(f"preflight: cannot reach the service{_printable(where)}: {_printable(reason)}{hint}", err=True)
        sys.exit(69)


# -- rollouts (issue 19) ---------------------------------------------------------------------------------------------
SERVER = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL.")
TOKEN = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A deployer or admin token (auditor: status only).")


# creating a large rollout validates it, and an abort restores its first chunk (up to 256 nodes), in the request
ROLLOUT_TIMEOUT_S = 300


def _safe(text, limit: int = 500) -> str:
    """One line of text from the service as printable: every control and format character escaped (\\x1b,
    \\u202e; newlines and tabs too), never emitted; at most ``limit`` characters."""
    text = str(text)
    return _printable(text[:limit], keep="") + ("…" if len(text) > limit else "")


ROLLOUT_MAX_BYTES = 16 << 20  # a rollout of 1,024 nodes with evidence is well under this


def _rollout_call(c, method: str, url: str, *, timeout: float, body=None):
    """One rollout request whose whole answer (headers and body, at most ROLLOUT_MAX_BYTES) arrives within
    ``timeout`` seconds — a server that drips bytes is given up on, not waited on — and is a JSON object; exit 1
    (saying so) otherwise, and on a problem answer."""
    import httpx

    from .agent.client import ResponseTooLarge, read_body

    start = time.monotonic()
    try:
        with c.stream(method, url, json=body, timeout=httpx.Timeout(max(1.0, timeout))) as r:
            raw = read_body(r, url, max_bytes=ROLLOUT_MAX_BYTES, start=start, deadline=max(1.0, timeout))
            full = httpx.Response(r.status_code, headers=r.headers, content=raw, request=r.request)
    except ResponseTooLarge as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(1)
    _fail_on_problem(full)
    try:
        out = json.loads(raw)
    except (ValueError, RecursionError):
        out = None
    if not isinstance(out, dict):
        typer.echo(f"preflight: {url}: the service's answer is not a JSON object", err=True)
        raise typer.Exit(1)
    return out


def _rollout_summary(r: dict) -> str:
    """A rollout as lines of text; every value from the service printed escaped and bounded. Raises ValueError for
    an answer that is not a rollout."""
    try:
        return _rollout_lines(r)
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the service's answer is not a rollout ({exc.__class__.__name__})") from None


def _rollout_lines(r: dict) -> str:
    def num(v) -> str:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else _safe(v, 40)

    target = r.get("target") if isinstance(r.get("target"), dict) else {}
    wave = r.get("wave")
    lines = [f"rollout {_safe(r['id'], 64)}: {_safe(r['state'], 40)}"
             + (f" (wave {wave})" if isinstance(wave, int) and not isinstance(wave, bool) and wave >= 0 else "")
             + (f", {_safe(target['manifest'])}" if target.get("manifest") is not None else "")
             + f", failures {num(r.get('failures', 0))} (limit {num(r.get('failure_limit'))})"
             + (f": {_safe(r['reason'])}" if r.get("reason") else "")]
    for j in (r.get("judged") or ())[:64]:  # the target's verdict per hardware shape
        rules = [f.get("rule") for f in (j.get("findings") or ())[:64] if isinstance(f, dict)]
        lines.append(f"  judged {num(j.get('nodes'))} node(s) of {num(j.get('gpu_count'))} x {_safe(j.get('gpu'))}: "
                     f"{_safe(j.get('verdict'), 40)}" + (f" ({_safe(', '.join(map(str, rules)))})" if rules else ""))
    for w in (r.get("warnings") or ())[:64]:
        lines.append(f"  warning {_safe(w.get('rule'), 64)}: {_safe(w.get('message'))}")
    for w in (r.get("waves") or ())[:64]:
        if "index" in w:
            lines.append(f"  wave {num(w['index'])}: {num(w.get('percent'))} %, bake {num(w.get('bake_s'))} s, "
                         f"{_safe(w.get('state'), 40)}, {len(w.get('nodes') or ())} node(s)")
    outcomes = r.get("outcomes")
    if isinstance(outcomes, dict) and outcomes:
        lines.append("  nodes: " + ", ".join(f"{_safe(k, 40)} {num(v)}" for k, v in sorted(outcomes.items())[:16]))
    for n in (r.get("nodes") or ())[:2048]:
        evidence = n.get("evidence") if isinstance(n.get("evidence"), dict) else {}
        reason, outcome = evidence.get("reason"), n.get("outcome")
        lines.append(f"  {_safe(n['node'], 128)}: wave {num(n.get('wave'))}, {_safe(outcome, 40)}"
                     + (f" ({_safe(reason, 64)})" if reason and reason != outcome else "")
                     + (f" [restore: {_safe(evidence['restore'])}]" if outcome == "not_restored"
                        and evidence.get("restore") else "")
                     + (f", seq {num(n['new_seq'])}" if n.get("new_seq") else "")
                     + (f", restored at seq {num(n['restored_seq'])}" if n.get("restored_seq") else ""))
    return "\n".join(lines)


def _echo_rollout(r: dict, as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    try:
        typer.echo(_rollout_summary(r))
    except ValueError as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(1)


@rollout_app.command("create")
def rollout_create(file: pathlib.Path = typer.Argument(..., help="The rollout as JSON (the body of POST "
                                                                 "/v1/rollouts; - for stdin)."),
                   server: str = SERVER, token: str = TOKEN,
                   as_json: bool = typer.Option(False, "--json", help="Print the response as JSON.")) -> None:
    """Create a rollout from a JSON file: target (manifest, engine_args, ...), nodes or selector, waves,
    failure_limit, gates. Exit 1 when the service refuses it (the findings are printed)."""
    try:
        body = json.loads(sys.stdin.read() if str(file) == "-" else file.read_text())
    except (OSError, ValueError) as exc:
        typer.echo(f"preflight: {file}: {exc}", err=True)
        raise typer.Exit(2)
    _echo_rollout(_rollout_call(_client(server, token), "POST", "/v1/rollouts", body=body,
                                timeout=ROLLOUT_TIMEOUT_S), as_json)


@rollout_app.command("status")
def rollout_status(rollout_id: Optional[str] = typer.Argument(None, help="A rollout id (default: list them)."),
                   server: str = SERVER, token: str = TOKEN,
                   as_json: bool = typer.Option(False, "--json", help="Print the response as JSON.")) -> None:
    """One rollout's state, waves and per-node outcome, or the list of rollouts. With a rollout id, the exit status
    says how it stands, for scripts: 0 completed, 3 halted, rolling back or rolled back, 4 aborted, 5 still going
    (``preflight rollout wait`` waits for the end)."""
    c = _client(server, token)
    body = _rollout_call(c, "GET", f"/v1/rollouts/{rollout_id}" if rollout_id else "/v1/rollouts", timeout=60)
    if as_json:
        typer.echo(json.dumps(body, indent=2))
    elif rollout_id:
        _echo_rollout(body)
    else:
        items = body.get("items")
        for item in (items if isinstance(items, list) else [])[:100]:
            _echo_rollout(item if isinstance(item, dict) else {})
    if rollout_id:
        raise typer.Exit(_rollout_exit(body.get("state")))


def _rollout_exit(state) -> int:
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
def rollout_wait(rollout_id: str = typer.Argument(..., help="The rollout id."), server: str = SERVER,
                 token: str = TOKEN,
                 timeout: float = typer.Option(3600.0, min=1, help="Give up after this many seconds (exit 5)."),
                 interval: float = typer.Option(5.0, min=0.5, help="Seconds between polls.")) -> None:
    """Wait until the rollout is over or halted, printing each change of state; the exit status is
    ``rollout status``'s (0 completed, 3 halted or rolled back, 4 aborted, 5 still going when the timeout passed)."""
    from .domain.rollout import FINAL

    over = FINAL + ("halted",)  # what it waits for
    c = _client(server, token)
    deadline, seen = time.monotonic() + timeout, None
    while True:
        # each poll within what is left of --timeout (at most 60 s): a server that stalls cannot hold the wait open
        body = _rollout_call(c, "GET", f"/v1/rollouts/{rollout_id}",
                             timeout=min(60.0, max(1.0, deadline - time.monotonic())))
        state = body.get("state")
        now = (state, body.get("wave"), body.get("failures"))
        if now != seen:
            try:
                typer.echo(_rollout_summary(body).splitlines()[0])
            except ValueError as exc:
                typer.echo(f"preflight: {exc}", err=True)
                raise typer.Exit(1)
            seen = now
        if state in over or time.monotonic() >= deadline:
            if state not in over:
                typer.echo(f"preflight: still {_safe(state, 40)} after {timeout:g} s", err=True)
            raise typer.Exit(_rollout_exit(state))
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def _rollout_verb(verb: str, doc: str):
    def run(rollout_id: str = typer.Argument(..., help="The rollout id."), server: str = SERVER, token: str = TOKEN,
            reason: Optional[str] = typer.Option(None, help="Why (recorded in the audit)."),
            as_json: bool = typer.Option(False, "--json", help="Print the response as JSON.")) -> None:
        _echo_rollout(_rollout_call(_client(server, token), "POST", f"/v1/rollouts/{rollout_id}/{verb}",
                                    body={"reason": reason} if reason else None, timeout=ROLLOUT_TIMEOUT_S), as_json)

    run.__doc__ = doc
    rollout_app.command(verb)(run)


for _verb, _doc in (("pause", "Stop advancing the rollout (failures past the limit still halt and restore)."),
                    ("resume", "Continue a paused rollout (a paused bake starts over)."),
                    ("promote", "Skip the current wave's bake."),
                    ("abort", "Stop the rollout and restore every node it changed to its previous plan.")):
    _rollout_verb(_verb, _doc)


_reflow_help(app)  # every command of every group, registered above


if __name__ == "__main__":  # pragma: no cover  (last: every command is registered by now)
    main()
