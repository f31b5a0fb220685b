"""Model versions' weight manifests: register (idempotent), list, read."""

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from ...services import idempotency
from ...services import manifests as manifest_service
from ..deps import Deployer, Reader, Route, SessionDep, replayable
from ..schemas import ManifestFullOut, ManifestIn, ManifestListOut, ManifestOut

router = APIRouter(route_class=Route)


@router.post(
    "/v1/manifests", status_code=201, operation_id="registerManifest", tags=["manifests"], response_model=ManifestOut
)
def register_manifest(
    request: Request,
    response: Response,
    body: ManifestIn,
    p: Deployer,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
):
    """Register a model version's weight manifest (config.json, quantization tag, layout, size, URI). Refused
    (422) when its tag and quantization configs disagree; ``Idempotency-Key`` makes a retry safe."""
    status, out, replayed = idempotency.run(
        request.app.state.db,
        route="POST /v1/manifests",
        principal=p.name,
        key=idempotency_key,
        request=body,
        status_code=201,
        action=lambda s: manifest_service.manifest_dict(manifest_service.register(s, actor=p.name, manifest=body)),
    )
    return replayable(response, status, out, replayed)


@router.get("/v1/manifests", operation_id="listManifests", tags=["manifests"], response_model=ManifestListOut)
def list_manifests(
    session: SessionDep,
    p: Reader,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
):
    """Registered manifests by id; ``next`` is the cursor (pass it as ``after``)."""
    rows = manifest_service.list_manifests(session, limit=limit, after=after)
    return {
        "items": [manifest_service.manifest_dict(m) for m in rows],
        "next": rows[-1].id if len(rows) == limit else None,
    }


@router.get("/v1/manifests/{ref:path}", operation_id="getManifest", tags=["manifests"], response_model=ManifestFullOut)
def get_manifest(ref: str, session: SessionDep, p: Reader):
    """A manifest by id, ``name@version`` or ``name`` (its newest version); names may contain ``/``."""
    m = manifest_service.resolve_ref(session, int(ref) if ref.isdigit() and len(ref) < 19 else ref)
    return manifest_service.manifest_dict(m, full=True)
