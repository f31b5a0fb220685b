"""The published signing keys and the key-set chain (no token)."""

from typing import Annotated

from fastapi import APIRouter, Query, Request

from ..deps import Route
from ..schemas import JwksOut, KeysetsOut

router = APIRouter(route_class=Route)


@router.get("/.well-known/jwks.json", operation_id="jwks", tags=["keys"], response_model=JwksOut)
def jwks(request: Request):
    """The published keys and their key-set ``version`` (save it on a node as its trust file)."""
    return request.app.state.keys.jwks()


@router.get("/v1/keysets", operation_id="keysets", tags=["keys"], response_model=KeysetsOut)
def keysets(
    request: Request, after: Annotated[int, Query(ge=0, le=2**31, description="the version the node trusts")] = 0
):
    """The key-set chain above version ``after``, oldest first: each statement (compact JWS, typ keyset+jwt)
    is version N of the published keys, signed by a key of version N-1. A node applies them in order to its
    trust file (service/agent/trust.py), so rotation and retirement reach it without re-provisioning."""
    keys = request.app.state.keys
    chain = keys.keysets(after)  # refreshes first: a rotation made by the CLI is seen at once
    return {"version": keys.keyset_version, "keysets": chain}
