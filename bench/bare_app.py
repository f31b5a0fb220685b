"""The baseline for bench/agent_fetch.py: a bare FastAPI endpoint on the agent-fetch route returning a constant
body of the same size (``BARE_BODY_BYTES``) and the same headers and media type, no auth, no database.

    BARE_BODY_BYTES=2400 uvicorn bench.bare_app:app --workers 2 --log-level info
"""

import os

from fastapi import FastAPI, Response

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


@app.get("/healthz")
async def healthz():
    return {"status": "ok"}
