"""The baseline for bench/agent_fetch.py and bench/boot_storm.py: bare FastAPI endpoints on the agents' routes, no
auth, no database — the fetch returns a constant body of the same size (``BARE_BODY_BYTES``) with the same headers
and media type; the report takes the same JSON body through a Pydantic model (FastAPI's way of reading a body) and
answers 201 with the stored report's shape.

    BARE_BODY_BYTES=2400 uvicorn bench.bare_app:app --workers 2 --log-level info
"""

import os
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

BODY = b"x" * int(os.environ.get("BARE_BODY_BYTES", "2048"))
HEADERS = {
    "ETag": '"0123456789abcdef0123456789abcdef"',
    "Cache-Control": "no-cache",
    "X-Plan-Id": "00000000-0000-0000-0000-000000000000",
    "X-Plan-Seq": "1",
    "X-Plan-Freshness": "x" * 480,
}  # a freshness statement's size (compact JWS)

app = FastAPI()


@app.get("/v1/nodes/{name}/plan")
async def fetch_node_plan(name: str):
    return Response(BODY, media_type="application/jose", headers=HEADERS)


class ReportIn(BaseModel):
    plan_id: str | None = None
    status: str
    message: str | None = None
    details: dict[str, Any] = {}


@app.post("/v1/nodes/{name}/reports", status_code=201)
async def report(name: str, body: ReportIn):
    return JSONResponse({"id": 1, "plan_id": body.plan_id, "node": name, "status": body.status}, status_code=201)


@app.get("/healthz")
async def healthz():
    return {"status": "ok"}
