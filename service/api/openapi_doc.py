"""The OpenAPI document: FastAPI's, plus the error contract on every operation (RFC 9457 problem+json) and
request examples built from a real config.json (service/data/examples)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details. `errors` names each offending field and rule; `findings` carries a "
    "rejected launch's rule findings (with remedies).",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {
            "type": "string",
            "description": "A URI naming the kind of problem (about:blank: the status says it).",
        },
        "title": {"type": "string", "description": "The HTTP status's phrase."},
        "status": {"type": "integer", "description": "The HTTP status code."},
        "detail": {"type": "string", "description": "What went wrong, for people."},
        "errors": {
            "type": "array",
            "description": "Each offending field: its path, the rule it broke, a message.",
            "items": {
                "type": "object",
                "properties": {
                    "field": {"type": "string", "description": "Dotted path of the field (engine_args.x, waves.0)."},
                    "rule": {"type": "string", "description": "The rule or check it broke."},
                    "message": {"type": "string", "description": "Why, for people."},
                    "accepted": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Values that would be accepted, when a list says it.",
                    },
                },
            },
        },
        "findings": {
            "type": "array",
            "items": {"type": "object"},
            "description": "A rejected launch's findings (rule, severity, message, remedy, source).",
        },
        "field": {"type": "string", "description": "The one field the problem is about, when there is one."},
    },
}
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": (
        "A token from `POST /v1/tokens` (admin, deployer, auditor), a node's agent token, or the admin token "
        "`make run` prints (var/admin-token)."
    ),
}
PUBLIC = {"healthz", "readyz", "jwks", "keysets", "metrics"}
CONFLICT = {
    "registerNode",
    "registerManifest",
    "createAuditCheckpoint",
    "revokeToken",
    "rotateToken",
    "reportNodeStatus",
    "createRollout",
    "pauseRollout",
    "resumeRollout",
    "promoteRollout",
    "abortRollout",
    "applyNodeTuning",
}
DESCRIPTIONS = {
    "400": "the body is not parseable (not UTF-8 / not JSON)",
    "401": "missing, unknown or revoked bearer token",
    "403": "the token's role (or node) may not do this",
    "404": "the named node, manifest, plan or token does not exist",
    "409": "already exists / conflicts with the current state",
    "412": "If-Match does not match the current ETag",
    "413": "request body larger than PREFLIGHT_MAX_BODY_BYTES",
    "422": "invalid input (field and rule named), or a launch vLLM would refuse (findings with remedies)",
    "503": "the database is unreachable (Retry-After)",
}


@lru_cache(maxsize=1)
def example_config() -> dict:
    return json.loads(
        resources.files("service").joinpath("data/examples/phi-3-medium-4k-instruct.config.json").read_text()
    )


def request_examples() -> dict[str, dict]:
    cfg = example_config()
    return {
        "validateLaunch": {
            "phi3-tp4-rejected": {
                "summary": "Phi-3-medium at TP=4: 10 KV heads do not split 4 ways",
                "value": {
                    "model": {"name": "microsoft/Phi-3-medium-4k-instruct", "config": cfg},
                    "hardware": {"gpu": "a100-sxm4-80gb", "count": 4, "interconnect": "nvlink"},
                    "engine_args": {"tensor_parallel_size": 4},
                },
            },
            "phi3-tp2": {
                "summary": "the same model at TP=2 with a workload (values filled and explained)",
                "value": {
                    "model": {"name": "microsoft/Phi-3-medium-4k-instruct", "config": cfg},
                    "hardware": {"gpu": "a100-sxm4-80gb", "count": 4, "interconnect": "nvlink"},
                    "workload": {"avg_seq_len": 1500, "p99_seq_len": 3500, "shape": "balanced"},
                    "engine_args": {"tensor_parallel_size": 2},
                },
            },
        },
        "registerManifest": {
            "phi3": {
                "summary": "a merged bf16 checkpoint",
                "value": {
                    "name": "microsoft/Phi-3-medium-4k-instruct",
                    "version": "1",
                    "uri": "s3://weights/phi-3-medium",
                    "config": cfg,
                    "checkpoint": {"layout": "merged"},
                    "weights_bytes": 27920000000,
                },
            },
        },
        **_fleet_examples(),
    }


def _fleet_examples() -> dict[str, dict]:
    """The examples of the requests that need no model config: plans, rollouts, nodes."""
    return {
        "createPlan": {
            "phi3-on-a100": {
                "summary": "plan for one node",
                "value": {
                    "manifest": "microsoft/Phi-3-medium-4k-instruct@1",
                    "nodes": ["gpu-01"],
                    "engine_args": {"tensor_parallel_size": 2, "max_model_len": 4096, "gpu_memory_utilization": 0.9},
                },
            },
            "two-node-tp16": {
                "summary": "one instance over two 8-GPU nodes (TP 16): each node signed its own "
                "command, the first node heads the group",
                "value": {
                    "manifest": "deepseek-ai/DeepSeek-V3@1",
                    "nodes": ["gpu-01", "gpu-02"],
                    "engine_args": {"tensor_parallel_size": 16, "max_model_len": 32768},
                    "group_env": [{"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}],
                },
            },
        },
        "createRollout": {
            "canary-then-all": {
                "summary": "a new max_model_len over four nodes: one node first, an hour's bake, "
                "then the rest; the first failure rolls back",
                "value": {
                    "manifest": "meta-llama/Llama-3.1-70B@1",
                    "nodes": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"],
                    "engine_args": {"tensor_parallel_size": 8, "max_model_len": 16384},
                    "waves": [{"percent": 25, "bake_s": 3600}, {"percent": 100}],
                    "failure_limit": 0,
                    "gates": {"ready_timeout_s": 600, "kv_tolerance": 0.2},
                },
            },
            "by-selector": {
                "summary": "every H100 node labelled pool=canary, in three waves",
                "value": {
                    "manifest": "meta-llama/Llama-3.1-70B@1",
                    "selector": {"gpu": "h100-sxm-80gb", "labels": {"pool": "canary"}},
                    "engine_args": {"tensor_parallel_size": 8, "max_model_len": 16384},
                    "waves": [{"percent": 10, "bake_s": 600}, {"percent": 50, "bake_s": 600}, {"percent": 100}],
                },
            },
        },
        "registerNode": {
            "h100": {
                "summary": "8 × H100 SXM by the name nvidia-smi prints",
                "value": {"name": "gpu-01", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "interconnect": "nvlink"},
            },
            "h200-head": {
                "summary": "8 × H200 with the address the other nodes of a group reach it at",
                "value": {
                    "name": "gpu-01",
                    "gpu": "h200-141gb",
                    "gpu_count": 8,
                    "interconnect": "nvlink",
                    "address": "10.0.0.11",
                },
            },
        },
    }


def install(app: FastAPI) -> None:
    """Replace ``app.openapi`` with the documented version (built once)."""

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
        schema["components"]["securitySchemes"] = {"bearer": BEARER_SCHEME}  # Swagger UI's Authorize button
        problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
        examples = request_examples()
        for path, ops in schema["paths"].items():
            for method, op in ops.items():
                oid = op.get("operationId")
                codes = ["503"]
                if oid not in PUBLIC:
                    codes += ["401", "403"]
                    op["security"] = [{"bearer": []}]  # the Authorize button (the header parameter stays listed)
                if "{" in path:
                    codes.append("404")
                if method in ("post", "patch", "put"):
                    codes += ["400", "413", "422"]
                elif op.get("parameters"):
                    codes.append("422")
                if oid in CONFLICT:
                    codes.append("409")
                if oid == "latestAuditCheckpoint":
                    codes.append("404")  # no checkpoint yet
                if oid == "updateNode":
                    codes.append("412")
                if oid == "listPlans":
                    codes.append("404")  # the cursor names no plan
                if oid == "createRollout":
                    codes.append("404")  # unknown manifest
                if oid == "createPlan":
                    codes += ["404", "409"]  # unknown manifest/node; Idempotency-Key reused for another body
                for code in sorted(set(codes)):
                    op["responses"][code] = {"description": DESCRIPTIONS[code], "content": problem}
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                if body is not None and oid in examples:
                    body["examples"] = examples[oid]
        schema["components"]["schemas"].pop("HTTPValidationError", None)
        schema["components"]["schemas"].pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
