"""Weight manifests: a model version's config.json, quantization tag, checkpoint layout, size and location."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import audit
from ..api.schemas import ManifestIn
from ..db.models import Manifest, iso
from ..domain.errors import DomainError
from ..domain.manifest_checks import check_manifest
from ..domain.model_facts import read_model_facts
from ..domain.quant_tag import parse_quantization_txt
from ..domain.render import model_reference_problem
from ..domain.versions import all_quant_methods
from ..errors import Conflict, NotFound

ALL_QUANT_METHODS = all_quant_methods()


def manifest_body(m: Manifest) -> dict[str, Any]:
    return {
        "name": m.name,
        "version": m.version,
        "uri": m.uri,
        "config": m.config,
        "quantization_txt": m.quantization_txt,
        "hf_quant_config": m.hf_quant_config,
        "checkpoint": m.checkpoint,
        "weights_bytes": m.weights_bytes,
        "digests": m.digests,
        "allow_remote_code": bool(m.allow_remote_code),
        **({"files": m.files} if m.files else {}),
        **({"tensors": m.tensors} if m.tensors else {}),
    }


def manifest_dict(m: Manifest, *, full: bool = False) -> dict[str, Any]:
    out = {
        "id": m.id,
        "name": m.name,
        "version": m.version,
        "uri": m.uri,
        "digest": m.digest,
        "checkpoint": m.checkpoint,
        "weights_bytes": m.weights_bytes,
        "allow_remote_code": bool(m.allow_remote_code),
        "created_at": iso(m.created_at),
    }
    if m.quantization_txt is not None:
        out["quantization"] = parse_quantization_txt(m.quantization_txt, ALL_QUANT_METHODS).method
    if m.tensors:
        out["layout_digest"] = m.tensors.get("layout_digest")
        out["tensor_format"] = (m.tensors.get("format") or {}).get("scheme")
    if full:
        out.update(manifest_body(m))
    return out


def _with_files(body: dict[str, Any]) -> dict[str, Any]:
    """``files`` as stored and signed: its quantization from quantization_txt (the tag the validator judged, not a
    value the client sent), unset digests left out. Absent files are left out of the body, so manifests registered
    before the field keep their digest."""
    if body.get("tensors") is None:  # absent: left out, so manifests registered before the field keep their digest
        body = {k: v for k, v in body.items() if k != "tensors"}
    elif body["tensors"].get("linears", 0) is None:  # likewise an inventory without linear shapes
        body = {**body, "tensors": {k: v for k, v in body["tensors"].items() if k != "linears"}}
    files = body.get("files")
    if not files:
        return {k: v for k, v in body.items() if k != "files"}
    tag = body.get("quantization_txt")
    files = {
        **{k: v for k, v in files.items() if v is not None},
        "quantization": parse_quantization_txt(tag, ALL_QUANT_METHODS).method if tag is not None else None,
        "shards": [{k: v for k, v in sh.items() if v is not None} for sh in files.get("shards") or []],
    }
    return {**body, "files": files}


def register(session: Session, *, actor: str, manifest: ManifestIn) -> Manifest:
    """Register a manifest after reading its config.json and tag the way the validator will (so a manifest that
    could never be judged is refused now). Raises DomainError / Conflict. Stored, and digested, as its JSON."""
    body = manifest.model_dump(mode="json")
    read_model_facts(body["config"], body.get("hf_quant_config"))
    if body.get("quantization_txt") is not None:  # an empty tag file is refused, not ignored
        parse_quantization_txt(body["quantization_txt"], ALL_QUANT_METHODS)
    check_manifest(body["config"], body.get("hf_quant_config"), body.get("quantization_txt"), body.get("tensors"))
    problem = model_reference_problem(body["uri"]) if body.get("uri") else None
    if problem:  # the uri becomes vllm serve's positional model argument on every node
        raise DomainError("uri", problem, rule="model_reference")
    if session.execute(
        select(Manifest.id).where(Manifest.name == body["name"], Manifest.version == body["version"])
    ).first():
        raise Conflict(f"manifest {body['name']}@{body['version']} already exists", field="version")
    body = {**body, "allow_remote_code": bool(body.get("allow_remote_code"))}
    body = _with_files(body)
    # the digest covers allow_remote_code only when set, so manifests registered before the field keep their digest
    digest = "sha256:" + audit.sha256_hex(
        audit.canonical(
            body if body["allow_remote_code"] else {k: v for k, v in body.items() if k != "allow_remote_code"}
        )
    )
    previous = session.execute(
        select(Manifest).where(Manifest.name == body["name"]).order_by(Manifest.id.desc()).limit(1)
    ).scalar_one_or_none()
    m = Manifest(digest=digest, **body)
    session.add(m)
    session.flush()
    audit.append(
        session,
        actor=actor,
        kind="manifest.registered",
        subject=f"manifest:{m.name}@{m.version}",
        model=m.name,
        payload={
            "id": m.id,
            "name": m.name,
            "version": m.version,
            "digest": digest,
            "uri": m.uri,
            "allow_remote_code": m.allow_remote_code,
        },
    )
    if previous is not None:
        audit.append(
            session,
            actor=actor,
            kind="manifest.superseded",
            subject=f"manifest:{previous.name}@{previous.version}",
            model=m.name,
            payload={"id": previous.id, "superseded_by": f"{m.name}@{m.version}"},
        )
    return m


def resolve_ref(session: Session, ref: str | int | dict) -> Manifest:
    """A manifest by id, ``name@version``, ``{"name", "version"}``, or ``name`` (its newest version)."""
    q = select(Manifest)
    if isinstance(ref, int):
        m = session.get(Manifest, ref)
    elif isinstance(ref, dict):
        m = session.execute(
            q.where(Manifest.name == ref.get("name"), Manifest.version == ref.get("version"))
        ).scalar_one_or_none()
    elif "@" in ref:
        name, version = ref.rsplit("@", 1)
        m = session.execute(q.where(Manifest.name == name, Manifest.version == version)).scalar_one_or_none()
    else:
        m = session.execute(q.where(Manifest.name == ref).order_by(Manifest.id.desc()).limit(1)).scalar_one_or_none()
    if m is None:
        raise NotFound(f"manifest {ref!r} is not registered", field="manifest")
    return m


def list_manifests(session: Session, *, limit: int, after: int | None) -> list[Manifest]:
    q = select(Manifest).order_by(Manifest.id).limit(limit)
    if after:
        q = q.where(Manifest.id > after)
    return list(session.execute(q).scalars())
