"""The operators' view at ``/ui/``: server-rendered pages (Jinja2, autoescaped; a few lines of plain JavaScript for the
copy button), every asset served by the service itself.

- **Fleet**: one row per node — hardware, agent last seen, desired vs running plan, drift, status, model, predicted
  vs measured KV tokens; filters by status and model.
- **Plan**: the ``vllm serve`` command, findings with remedies, recommendations, the per-GPU memory bar, its nodes
  and their reports.
- **Audit**: the timeline with filters, the chain's verify status and the newest checkpoint.
- **Try a launch**: a dry run of ``POST /v1/plans`` (nothing stored).

Sign-in: a form takes a token and sets a session cookie — HttpOnly, SameSite=Strict, Path=/ui, Secure over HTTPS —
holding the token's id, a prefix of its SHA-256 and the time it was issued, signed with a secret derived from the
service's signing keys (itsdangerous; expires after ``SESSION_SECONDS``). The token is looked up on every request, so
a revoked token ends its sessions at once; the raw token is never in the cookie. ``Authorization: Bearer`` works too.
Every POST made with the cookie carries a CSRF token (an HMAC of the session cookie with a key-derived secret); the
sign-in form has its own (double-submit against a short-lived pre-session cookie). Roles see what the API shows them:
env values only for admin and deployer, the audit for admin and auditor, the dry run for admin and deployer."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import re
import secrets as pysecrets
from importlib import resources
from typing import Any, Callable
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from itsdangerous import BadSignature, URLSafeTimedSerializer
from pydantic import ValidationError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ..db.models import AuditEvent, Manifest, Report, Token, iso
from ..domain.errors import DomainError
from ..domain.text import escape_invisible
from ..errors import ApiError, Busy, LaunchRejected
from ..services import fleet, history
from ..services import manifests as manifest_service
from ..services import nodes as node_service
from ..services import plans as plan_service
from ..services import tuning as tuning_service
from ..services import rollouts as rollout_service
from ..services.tokens import Principal, hash_token
from .schemas import PlanIn

SESSION_COOKIE = "pf_session"
LOGIN_COOKIE = "pf_login"
SESSION_SECONDS = 8 * 3600
LOGIN_SECONDS = 1800
UI_ROLES = ("admin", "deployer", "auditor")  # agent tokens speak for one node: they do not sign in here
SECRETS = ("admin", "deployer")  # who sees env values (as the API)
AUDITORS = ("admin", "auditor")
DEPLOYERS = ("admin", "deployer")
SECRET_LABEL = b"preflight ui session v1"
ROLLOUTS_SHOWN = 10  # the newest staged rollouts listed on the fleet page
ROLLOUT_EVENTS = 200  # the newest audit events shown on a rollout's page
MAX_NODES = 10_000  # the fleet page reads the inventory in pages of 500 up to this many
AUDIT_PAGE = 100
KNOWN_KINDS = ("node.registered", "node.updated", "manifest.registered", "manifest.superseded", "plan.created",
               "plan.superseded", "plan.revoked", "plan.reissued", "plan.fetched", "agent.fetched", "agent.started",
               "agent.running", "agent.stopped", "agent.exited", "agent.failed", "agent.refused", "agent.reset",
               "token.created", "token.revoked", "token.rotated")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


class PageError(Exception):
    """A page that cannot be shown as asked: rendered as the error page with this status (never a 500)."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


# -- presentation helpers (pure) -------------------------------------------------------------------------------------

GIB = 1024 ** 3
SEGMENTS = (  # (budget key, label, css class) in the order vLLM spends the GPU's memory
    ("weights_bytes_per_gpu", "Weights", "seg-weights"),
    ("activation_peak_bytes", "Activation peak", "seg-activation"),
    ("cuda_graph_bytes", "CUDA graphs", "seg-graphs"),
    ("non_torch_bytes", "Non-torch", "seg-nontorch"),
    ("kv_cache_bytes_per_gpu", "KV cache", "seg-kv"),
)


def memory_bar(budget: dict[str, Any] | None) -> dict[str, Any] | None:
    """The per-GPU memory bar of a plan's budget: each claimant's bytes, GiB and share of the GPU's memory, and the
    headroom left (what ``gpu_memory_utilization`` keeps free plus anything unclaimed). None without a budget."""
    if not budget or not budget.get("gpu_memory_bytes"):
        return None
    total = int(budget["gpu_memory_bytes"])
    segs = []
    used = 0
    for key, label, css in SEGMENTS:
        value = max(0, int(budget.get(key) or 0))
        used += value
        segs.append({"key": key, "label": label, "css": css, "bytes": value})
    segs.append({"key": "headroom", "label": "Headroom", "css": "seg-headroom", "bytes": max(0, total - used)})
    scale = max(total, used)
    x = 0.0
    for s in segs:
        s["gib"] = round(s["bytes"] / GIB, 2)
        s["pct"] = round(100 * s["bytes"] / scale, 2)
        s["x"] = round(x, 2)
        x += s["pct"]
    return {"segments": segs, "total_gib": round(total / GIB, 2), "over": used > total,
            "utilization": budget.get("gpu_memory_utilization"), "max_model_len": budget.get("max_model_len"),
            "max_concurrency": budget.get("max_concurrency"), "kv_cache_tokens": budget.get("kv_cache_tokens"),
            "max_num_seqs_bound": budget.get("max_num_seqs_bound"), "log_line": budget.get("log_line")}


CHART_SERIES = (("max_num_seqs", "max_num_seqs"), ("num_requests_waiting", "waiting"),
                ("num_preemptions", "preemptions"), ("e2e_p99_s", "P99 e2e (s)"))


def tuning_charts(windows: list[dict[str, Any]], width: int = 320, height: int = 36) -> list[dict[str, Any]]:
    """One small line chart per series of the tuning loop's windows (issue 16), as SVG polyline points scaled to
    the series' own maximum, with the first, last and largest value for the text beside it."""
    out = []
    n = len(windows)
    for key, label in CHART_SERIES:
        vals = [w.get(key) for w in windows]
        nums = [float(v) for v in vals if isinstance(v, (int, float))]
        top = max(nums) if nums else 0.0
        pts = []
        for i, v in enumerate(vals):
            if not isinstance(v, (int, float)):
                continue
            x = width * i / max(1, n - 1)
            y = height - (height - 2) * (float(v) / top if top > 0 else 0.0) - 1
            pts.append(f"{x:.1f},{y:.1f}")
        out.append({"key": key, "label": label, "points": " ".join(pts), "width": width, "height": height,
                    "first": nums[0] if nums else None, "last": nums[-1] if nums else None,
                    "max": top if nums else None})
    return out


def short_time(value: str | None) -> str:
    if not value:
        return "—"
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        return value
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: str | None, now: dt.datetime | None = None) -> str:
    if not value:
        return "never"
    t = dt.datetime.fromisoformat(value)
    seconds = int(((now or dt.datetime.now(dt.timezone.utc)) - t).total_seconds())
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def thousands(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else ("—" if value is None else str(value))


def pretty_json(value: Any) -> str:
    """JSON for reading: ×, é and 中 as themselves; invisible, format and bidi characters escaped (text.py)."""
    return escape_invisible(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False), keep="\n")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resources.files("service.api") / "templates")),
                             autoescape=True)  # every value escaped (XSS), .html or not
    env.filters.update(short_time=short_time, ago=ago, thousands=thousands, pretty_json=pretty_json,
                       visible=lambda v: escape_invisible(str(v)))
    env.globals["urlencode"] = urlencode
    return env


def safe_next(value: str | None) -> str:
    """Where to go after sign-in: a path of this UI only (never another host: no open redirect)."""
    if value and value.startswith("/ui/") and not value.startswith("//") and "\\" not in value and \
            all(c.isprintable() for c in value) and len(value) <= 512:
        return value
    return "/ui/"


def parse_time(field: str, value: str | None) -> dt.datetime | None:
    if not value:
        return None
    if len(value) > 40:
        raise PageError(422, f"{field}: not an ISO 8601 time", field)
    try:
        t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise PageError(422, f"{field}: {value!r} is not an ISO 8601 time (e.g. 2026-12-01T10:00:00Z)", field) \
            from None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def bounded(field: str, value: str | None, limit: int = 256) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > limit or not value.isprintable():
        raise PageError(422, f"{field}: at most {limit} printable characters", field)
    return value


# -- sessions and CSRF -------------------------------------------------------------------------------------------------

class Sessions:
    """Signed, expiring session cookies and CSRF tokens, with secrets derived from the service's signing keys (any
    key of the directory verifies; the active one signs, so a key rotation does not sign everyone out)."""

    def __init__(self, keys):
        self.keys = keys

    def _secrets(self) -> list[bytes]:
        derived = self.keys.derived_secrets(SECRET_LABEL)
        active = self.keys.active_kid
        return [v for k, v in sorted(derived.items()) if k != active] + [derived[active]]  # itsdangerous signs with the last

    def _serializer(self, salt: str) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(self._secrets(), salt=salt)

    def issue(self, principal: Principal, secret: str) -> str:
        return self._serializer("session").dumps({"t": principal.token_id or 0, "h": hash_token(secret)[:32],
                                                  "n": pysecrets.token_urlsafe(8)})

    def read(self, cookie: str | None) -> dict | None:
        if not cookie or len(cookie) > 1024:
            return None
        try:
            data = self._serializer("session").loads(cookie, max_age=SESSION_SECONDS)
        except BadSignature:  # includes SignatureExpired
            return None
        return data if isinstance(data, dict) and isinstance(data.get("t"), int) and \
            isinstance(data.get("h"), str) else None

    def csrf(self, bound_to: str) -> str:
        return hmac.new(self._secrets()[-1], b"csrf\x00" + bound_to.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, bound_to: str | None, token: str | None) -> bool:
        if not bound_to or not token or len(token) != 64:
            return False
        return any(hmac.compare_digest(hmac.new(k, b"csrf\x00" + bound_to.encode(), hashlib.sha256).hexdigest(), token)
                   for k in self._secrets())


# -- the router --------------------------------------------------------------------------------------------------------

def install(app: FastAPI, *, authenticate: Callable[[str], Principal]) -> None:
    """Mount the pages under ``/ui/`` (``/`` redirects there) and their static files under ``/ui/static/``.
    ``authenticate`` maps a bearer secret to its principal (raises Unauthorized), as the API does."""
    db, keys, settings = app.state.db, app.state.keys, app.state.settings
    env = _environment()
    sessions = Sessions(keys)
    app.mount("/ui/static", StaticFiles(directory=str(resources.files("service.api") / "static")), name="ui-static")

    def page(request: Request, template: str, http_status: int = 200, **context) -> HTMLResponse:
        body = env.get_template(template).render(request=request, **context)
        return HTMLResponse(body, status_code=http_status, headers=PAGE_HEADERS)

    def from_cookie(data: dict) -> Principal | None:
        if data["t"] == 0:  # the env admin token (PREFLIGHT_ADMIN_TOKEN) has no row
            if settings.admin_token and hmac.compare_digest(hash_token(settings.admin_token)[:32], data["h"]):
                return Principal(role="admin", name="admin")
            return None
        with db.read() as s:
            row = s.get(Token, data["t"])
            if row is None or row.revoked_at is not None or row.role not in UI_ROLES or \
                    not hmac.compare_digest(row.token_hash[:32], data["h"]):
                return None
            return Principal(role=row.role, name=f"{row.role}:token-{row.id}", token_id=row.id)

    def who(request: Request) -> tuple[Principal | None, str | None]:
        """(principal, session cookie) — the bearer header first (no cookie then), else the session cookie."""
        auth = request.headers.getlist("authorization")
        if auth:
            if len(auth) > 1 or not auth[0].lower().startswith("bearer "):
                raise PageError(401, "send exactly one Authorization: Bearer header")
            try:
                p = authenticate(auth[0].split(" ", 1)[1].strip())
            except ApiError as exc:
                raise PageError(401, exc.detail) from None
            if p.role not in UI_ROLES:
                raise PageError(403, "agent tokens cannot use the operators' pages")
            return p, None
        cookie = request.cookies.get(SESSION_COOKIE)
        data = sessions.read(cookie)
        return (from_cookie(data), cookie) if data is not None else (None, None)

    def login_redirect(request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/ui/login?" + urlencode({"next": safe_next(target)}), status_code=303)

    def common(p: Principal, cookie: str | None, active: str) -> dict[str, Any]:
        return {"principal": p, "csrf": sessions.csrf(cookie) if cookie else "", "active": active,
                "can_audit": p.role in AUDITORS, "can_deploy": p.role in DEPLOYERS}

    def guarded(active: str, roles: tuple[str, ...] = UI_ROLES):
        """Wrap a page: sign-in (cookie or bearer), the role, and every PageError / ApiError as an HTML page."""
        def wrap(fn):
            async def handler(request: Request):
                try:
                    p, cookie = await run_in_threadpool(who, request)
                    if p is None:
                        return login_redirect(request)
                    ctx = common(p, cookie, active)
                    if p.role not in roles:
                        raise PageError(403, f"role {p.role} may not see this page (needs {' or '.join(roles)})")
                    return await fn(request, p, cookie, ctx)
                except PageError as exc:
                    return error_page(request, exc.status, exc.message, exc.field, locals().get("ctx"))
                except ApiError as exc:
                    return error_page(request, exc.status, exc.detail, exc.extra.get("field"), locals().get("ctx"))
                except DomainError as exc:
                    return error_page(request, 422, exc.message, exc.field, locals().get("ctx"))
            handler.__name__ = fn.__name__
            return handler
        return wrap

    def error_page(request: Request, status: int, message: str, field: str | None, ctx: dict | None):
        return page(request, "error.html", http_status=status, message=message, field=field,
                    **(ctx or {"principal": None, "csrf": "", "active": "", "can_audit": False, "can_deploy": False}))

    # -- redirects, sign-in --------------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def root():
        return RedirectResponse("/ui/", status_code=307)

    @app.get("/ui", include_in_schema=False)
    def ui_root():
        return RedirectResponse("/ui/", status_code=307)

    def login_form(request: Request, status: int = 200, message: str | None = None, next_: str = "/ui/"):
        nonce = pysecrets.token_urlsafe(16)
        resp = page(request, "login.html", http_status=status, message=message, next=safe_next(next_),
                    csrf=sessions.csrf("login:" + nonce), principal=None, active="login", can_audit=False,
                    can_deploy=False)
        resp.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_SECONDS, path="/ui", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
        return resp

    @app.get("/ui/login", include_in_schema=False)
    def login_page(request: Request, next: str | None = None):
        return login_form(request, next_=next or "/ui/")

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request):
        form = await request.form()
        token, csrf, next_ = form.get("token"), form.get("csrf"), form.get("next")
        next_ = safe_next(next_ if isinstance(next_, str) else None)
        nonce = request.cookies.get(LOGIN_COOKIE)
        if not isinstance(csrf, str) or not nonce or not sessions.csrf_ok("login:" + nonce, csrf):
            return login_form(request, 403, "The sign-in form expired or did not come from this page: try again.",
                              next_)
        if not isinstance(token, str) or not token.strip() or len(token) > 512:
            return login_form(request, 422, "token: paste a Preflight token (admin, deployer or auditor).", next_)
        secret = token.strip()
        try:
            p = await run_in_threadpool(authenticate, secret)
        except ApiError:
            return login_form(request, 401, "token: unknown or revoked token.", next_)
        if p.role not in UI_ROLES:
            return login_form(request, 403, "token: agent tokens cannot sign in here.", next_)
        resp = RedirectResponse(next_, status_code=303)
        resp.set_cookie(SESSION_COOKIE, sessions.issue(p, secret), max_age=SESSION_SECONDS, path="/ui",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
        resp.delete_cookie(LOGIN_COOKIE, path="/ui")
        return resp

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request):
        form = await request.form()
        cookie = request.cookies.get(SESSION_COOKIE)
        csrf = form.get("csrf")
        if cookie and not sessions.csrf_ok(cookie, csrf if isinstance(csrf, str) else None):
            return error_page(request, 403, "csrf: the sign-out form did not come from this page", "csrf", None)
        resp = RedirectResponse("/ui/login", status_code=303)
        resp.delete_cookie(SESSION_COOKIE, path="/ui")
        return resp

    # -- fleet ---------------------------------------------------------------------------------------------------
    def fleet_rows() -> list[dict[str, Any]]:
        with db.read() as s:
            nodes, after = [], None
            while len(nodes) < MAX_NODES:
                page_ = node_service.list_nodes(s, limit=500, after=after)
                nodes += page_
                if len(page_) < 500:
                    break
                after = page_[-1].name
            states = fleet.node_states(s, [n.name for n in nodes])
        return [{**fleet.node_view(n, states[n.name]), "address": getattr(n, "address", None)} for n in nodes]

    def rollout_rows() -> list[dict[str, Any]]:
        """The newest staged rollouts (issue 19), for the fleet page."""
        with db.read() as s:
            return rollout_service.list_rollouts(s, state=None, limit=ROLLOUTS_SHOWN, after=None,
                                                 secrets=False)["items"]

    @app.get("/ui/", include_in_schema=False)
    @guarded("fleet")
    async def fleet_page(request: Request, p: Principal, cookie, ctx):
        q = request.query_params
        status = bounded("status", q.get("status"), 16)
        model = bounded("model", q.get("model"))
        if status and status not in fleet.NODE_STATUSES:
            raise PageError(422, f"status: one of {', '.join(fleet.NODE_STATUSES)}", "status")
        nodes = await run_in_threadpool(fleet_rows)
        rows = fleet.group_rows(nodes)  # one row per node, or per multi-node group
        rollouts = await run_in_threadpool(rollout_rows)
        models = sorted({r["plan"]["model"] for r in rows if r["plan"]})
        counts = {st: sum(1 for r in nodes if r["status"] == st) for st in fleet.NODE_STATUSES}  # nodes, not rows
        shown = [r for r in rows if (not status or r["status"] == status)
                 and (not model or (r["plan"] and r["plan"]["model"] == model))]
        return page(request, "fleet.html", rows=shown, total=len(nodes), models=models, statuses=fleet.NODE_STATUSES,
                    counts=counts, drifted=sum(1 for r in nodes if r["drift"]), status=status or "",
                    model=model or "", rollouts=rollouts, **ctx)

    # -- plan ----------------------------------------------------------------------------------------------------
    def plan_data(plan_id: str, p: Principal) -> dict[str, Any]:
        with db.read() as s:
            plan, assignments = plan_service.get(s, plan_id)
            manifest = s.get(Manifest, plan.manifest_id)
            out = plan_service.plan_dict(plan, assignments, secrets=p.role in SECRETS)
            placements = history.plan_placements(s, plan_id)["placements"]
            states = fleet.node_states(s, [a.node_name for a in assignments])
            reports = [{"node": r.node_name, "status": r.status, "message": r.message, "at": iso(r.created_at)}
                       for r in s.execute(select(Report).where(Report.plan_id == plan_id)
                                          .order_by(Report.id.desc()).limit(50)).scalars()]
            tuning = {a.node_name: tuning_charts(w) for a in assignments[:8]
                      if (w := tuning_service.trajectory(s, a.node_name))}
        return {"plan": out, "manifest": manifest, "placements": placements, "states": states, "reports": reports,
                "recommendations": plan.recommendations, "bar": memory_bar(plan.budget), "tuning": tuning}

    def detail_page(what: str, data: Callable[[str, Principal], dict[str, Any]]) -> None:
        """``/ui/{what}s/{id}``: one plan or rollout by its id (a uuid: a longer id is a 404 before any read)."""
        param = f"{what}_id"

        async def show(request: Request, p: Principal, cookie, ctx):
            key = request.path_params[param]
            if len(key) > 36:
                raise PageError(404, f"no such {what}", param)
            return page(request, f"{what}.html", **await run_in_threadpool(data, key, p), **ctx)

        show.__name__ = f"{what}_page"
        app.get(f"/ui/{what}s/{{{param}}}", include_in_schema=False)(guarded("fleet")(show))

    detail_page("plan", plan_data)

    # -- rollout -------------------------------------------------------------------------------------------------
    def rollout_data(rollout_id: str, p: Principal) -> dict[str, Any]:
        with db.read() as s:
            r = rollout_service.rollout_dict(s, rollout_service.get(s, rollout_id), secrets=p.role in SECRETS)
            events = [] if p.role not in AUDITORS else [  # the steps and their reasons, as the audit holds them
                {"id": e.id, "at": iso(e.ts), "kind": e.kind, "actor": e.actor, "node": e.node, "plan_id": e.plan_id,
                 "payload": e.payload}
                for e in s.execute(select(AuditEvent).where(AuditEvent.subject == f"rollout:{rollout_id}")
                                   .order_by(AuditEvent.id.desc()).limit(ROLLOUT_EVENTS)).scalars()]
        return {"r": r, "events": events}

    detail_page("rollout", rollout_data)

    # -- audit ---------------------------------------------------------------------------------------------------
    def audit_data(f: dict[str, Any], before: int | None, verify: bool) -> dict[str, Any]:
        q = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(AUDIT_PAGE)
        for col, key in ((AuditEvent.node, "node"), (AuditEvent.model, "model"), (AuditEvent.kind, "kind")):
            if f[key]:
                q = q.where(col == f[key])
        if f["since_t"]:
            q = q.where(AuditEvent.ts >= f["since_t"])
        if f["until_t"]:
            q = q.where(AuditEvent.ts < f["until_t"])
        if before:
            q = q.where(AuditEvent.id < before)
        verified = None
        if verify:
            try:
                verified = app.state.verify_audit()
            except Busy as exc:
                verified = {"busy": exc.detail}
        with db.read() as s:
            events = list(s.execute(q).scalars())
            cp = db.sealer.checkpointer.newest_row(s)
            checkpoint = {"last_seq": cp.last_seq, "events": cp.events, "head": cp.head, "kid": cp.kid,
                          "created_at": iso(cp.created_at)} if cp is not None else None
        items = [{"id": e.id, "ts": iso(e.ts), "kind": e.kind, "actor": e.actor, "node": e.node, "model": e.model,
                  "plan_id": e.plan_id, "subject": e.subject, "seq": e.chain_seq,
                  "payload": e.payload} for e in events]
        return {"events": items, "checkpoint": checkpoint, "verified": verified,
                "older": events[-1].id if len(events) == AUDIT_PAGE else None}

    @app.get("/ui/audit", include_in_schema=False)
    @guarded("audit", AUDITORS)
    async def audit_page(request: Request, p: Principal, cookie, ctx):
        q = request.query_params
        f = {"node": bounded("node", q.get("node"), 128), "model": bounded("model", q.get("model")),
             "kind": bounded("kind", q.get("kind"), 48), "since": bounded("since", q.get("since"), 40),
             "until": bounded("until", q.get("until"), 40)}
        f["since_t"], f["until_t"] = parse_time("since", f["since"]), parse_time("until", f["until"])
        if f["since_t"] and f["until_t"] and f["until_t"] < f["since_t"]:
            raise PageError(422, "until: before since", "until")
        before = q.get("before")
        if before is not None and not (before.isdigit() and len(before) < 19):
            raise PageError(422, "before: an event id", "before")
        data = await run_in_threadpool(audit_data, f, int(before) if before else None, q.get("verify") == "1")
        filters = {k: f[k] or "" for k in ("node", "model", "kind", "since", "until")}
        older = data.pop("older")
        older_href = "/ui/audit?" + urlencode({**{k: v for k, v in filters.items() if v}, "before": older}) \
            if older else None
        return page(request, "audit.html", filters=filters, kinds=KNOWN_KINDS, older_href=older_href, **data, **ctx)

    # -- try a launch (dry run) --------------------------------------------------------------------------------------
    def try_choices() -> dict[str, Any]:
        with db.read() as s:
            manifests = manifest_service.list_manifests(s, limit=500, after=None)
            nodes = node_service.list_nodes(s, limit=500, after=None)
        return {"manifests": [f"{m.name}@{m.version}" for m in manifests],
                "nodes": [{"name": n.name, "gpu": n.gpu.get("name"), "count": n.gpu_count} for n in nodes]}

    EMPTY_FORM = {"manifest": "", "nodes": [], "engine_args": "{}", "environment": "production", "avg_seq_len": "",
                  "p99_seq_len": "", "shape": "", "vllm_version": ""}

    @app.get("/ui/try", include_in_schema=False)
    @guarded("try", DEPLOYERS)
    async def try_page(request: Request, p: Principal, cookie, ctx):
        choices = await run_in_threadpool(try_choices)
        return page(request, "try.html", form=EMPTY_FORM, result=None, errors=[], **choices, **ctx)

    def form_body(form) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, str]]]:
        """(the form's values to show again, the plan body, errors naming the field)."""
        def text(key: str, limit: int = 65536) -> str:
            v = form.get(key)
            return v[:limit] if isinstance(v, str) else ""

        shown = {"manifest": text("manifest", 512), "nodes": [n for n in form.getlist("nodes") if isinstance(n, str)][:256],
                 "engine_args": text("engine_args") or "{}", "environment": text("environment", 32) or "production",
                 "avg_seq_len": text("avg_seq_len", 16).strip(), "p99_seq_len": text("p99_seq_len", 16).strip(),
                 "shape": text("shape", 32), "vllm_version": text("vllm_version", 32).strip()}
        errors: list[dict[str, str]] = []
        try:
            engine_args = json.loads(shown["engine_args"])
            if not isinstance(engine_args, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            errors.append({"field": "engine_args", "message": f"a JSON object of engine arguments ({exc})"})
            engine_args = {}
        workload: dict[str, Any] = {}
        for key in ("avg_seq_len", "p99_seq_len"):
            if shown[key]:
                if shown[key].isdigit() and len(shown[key]) < 10:
                    workload[key] = int(shown[key])
                else:
                    errors.append({"field": f"workload.{key}", "message": "a whole number of tokens"})
        if shown["shape"]:
            workload["shape"] = shown["shape"]
        body = {"manifest": shown["manifest"], "nodes": shown["nodes"], "engine_args": engine_args,
                "environment": shown["environment"], "workload": workload or None,
                "vllm_version": shown["vllm_version"] or None}
        return shown, body, errors

    def judge(body: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
        try:
            data = PlanIn.model_validate(body)
        except ValidationError as exc:
            return None, [{"field": ".".join(str(x) for x in e["loc"]) or "body", "message": e["msg"]}
                          for e in exc.errors()[:10]]
        try:
            with db.read() as s:
                return fleet.dry_run(s, data), []
        except LaunchRejected as exc:
            return {"verdict": "reject", "detail": exc.detail, **exc.extra}, []
        except ApiError as exc:
            errs = exc.extra.get("errors") or [{"field": exc.extra.get("field") or "body", "message": exc.detail}]
            return None, [{"field": e.get("field") or "body", "message": e.get("message") or exc.detail} for e in errs]
        except DomainError as exc:
            return None, [{"field": exc.field, "message": exc.message}]

    @app.post("/ui/try", include_in_schema=False)
    @guarded("try", DEPLOYERS)
    async def try_run(request: Request, p: Principal, cookie, ctx):
        form = await request.form()
        if cookie is not None:  # signed in by cookie: the form must carry this session's CSRF token
            csrf = form.get("csrf")
            if not sessions.csrf_ok(cookie, csrf if isinstance(csrf, str) else None):
                raise PageError(403, "csrf: the form did not come from this page (reload it and try again)", "csrf")
        shown, body, errors = form_body(form)
        result = None
        if not errors:
            result, errors = await run_in_threadpool(judge, body)
        choices = await run_in_threadpool(try_choices)
        status = 200 if result is not None else 422
        return page(request, "try.html", http_status=status, form=shown, result=result, errors=errors,
                    bar=memory_bar(result.get("budget")) if result else None, **choices, **ctx)

