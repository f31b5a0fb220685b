"""Try a launch: a dry run of ``POST /v1/plans`` from a form (nothing stored) — the verdict, the command, the
findings and the memory bar, or the errors naming the field. Admin and deployer only."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ...db.session import Database
from ...domain.errors import DomainError
from ...domain.policy_profile import Profile
from ...errors import ApiError, LaunchRejected
from ...services import fleet
from ...services import manifests as manifest_service
from ...services import nodes as node_service
from ..schemas import PlanIn
from .auth import Deployer, DeployerForm
from .present import memory_bar
from .render import PageRoute, page
from .state import UiState

EMPTY_FORM = {
    "manifest": "",
    "nodes": [],
    "engine_args": "{}",
    "environment": "production",
    "avg_seq_len": "",
    "p99_seq_len": "",
    "shape": "",
    "vllm_version": "",
}

router = APIRouter(route_class=PageRoute)


def try_choices(db: Database) -> dict[str, Any]:
    with db.read() as s:
        manifests = manifest_service.list_manifests(s, limit=500, after=None)
        nodes = node_service.list_nodes(s, limit=500, after=None)
    return {
        "manifests": [f"{m.name}@{m.version}" for m in manifests],
        "nodes": [{"name": n.name, "gpu": n.gpu.get("name"), "count": n.gpu_count} for n in nodes],
    }


def form_values(form) -> dict[str, Any]:
    """The form's values, each cut to its bound, to show again."""

    def text(key: str, limit: int = 65536) -> str:
        v = form.get(key)
        return v[:limit] if isinstance(v, str) else ""

    return {
        "manifest": text("manifest", 512),
        "nodes": [n for n in form.getlist("nodes") if isinstance(n, str)][:256],
        "engine_args": text("engine_args") or "{}",
        "environment": text("environment", 32) or "production",
        "avg_seq_len": text("avg_seq_len", 16).strip(),
        "p99_seq_len": text("p99_seq_len", 16).strip(),
        "shape": text("shape", 32),
        "vllm_version": text("vllm_version", 32).strip(),
    }


def form_body(form) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, str]]]:
    """(the form's values to show again, the plan body, errors naming the field)."""
    shown = form_values(form)
    errors: list[dict[str, str]] = []
    try:
        engine_args = json.loads(shown["engine_args"])
        if not isinstance(engine_args, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        errors.append({"field": "engine_args", "message": f"a JSON object of engine arguments ({why})"})
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
    body = {
        "manifest": shown["manifest"],
        "nodes": shown["nodes"],
        "engine_args": engine_args,
        "environment": shown["environment"],
        "workload": workload or None,
        "vllm_version": shown["vllm_version"] or None,
    }
    return shown, body, errors


def judge(
    db: Database, body: dict[str, Any], policy: Profile | None = None
) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The dry run's result under the service's policy profile (a verdict, a rejection included), or the errors
    naming the field."""
    try:
        data = PlanIn.model_validate(body)
    except ValidationError as exc:
        return None, [
            {"field": ".".join(str(x) for x in e["loc"]) or "body", "message": e["msg"]} for e in exc.errors()[:10]
        ]
    try:
        with db.read() as s:
            return fleet.dry_run(s, data, policy=policy), []
    except LaunchRejected as exc:
        return {"verdict": "reject", "detail": exc.detail, **exc.extra}, []
    except ApiError as exc:
        errs = exc.extra.get("errors") or [{"field": exc.extra.get("field") or "body", "message": exc.detail}]
        return None, [{"field": e.get("field") or "body", "message": e.get("message") or exc.detail} for e in errs]
    except DomainError as exc:
        return None, [{"field": exc.field, "message": exc.message}]


@router.get("/ui/try")
async def try_page(request: Request, viewer: Deployer, state: UiState):
    choices = await run_in_threadpool(try_choices, state.db)
    return page(request, "try.html", form=EMPTY_FORM, result=None, errors=[], **choices, **viewer.context)


@router.post("/ui/try")
async def try_run(request: Request, viewer: DeployerForm, state: UiState):
    shown, body, errors = form_body(await request.form())
    result = None
    if not errors:
        result, errors = await run_in_threadpool(judge, state.db, body, state.settings.policy)
    choices = await run_in_threadpool(try_choices, state.db)
    status = 200 if result is not None else 422
    return page(
        request,
        "try.html",
        http_status=status,
        form=shown,
        result=result,
        errors=errors,
        bar=memory_bar(result.get("budget")) if result else None,
        **choices,
        **viewer.context,
    )
