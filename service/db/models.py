"""SQLAlchemy 2 models. Every table is created by the Alembic migrations in migrations/versions/."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(value: dt.datetime | None) -> str | None:
    """ISO 8601 in UTC with its offset (SQLite hands back naive datetimes: they are UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat()


# Surrogate keys are 64-bit (the API accepts ids up to 2^62). SQLite's INTEGER PRIMARY KEY is already a 64-bit rowid
# (and only that exact type name autoincrements), PostgreSQL gets BIGINT with a bigint sequence (migration 0004).
ID = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def table_of(model: type[Base]) -> Table:
    """The model's Table, for Core statements (insert, update, delete). SQLAlchemy declares ``__table__`` as a
    FromClause, which those statements do not take; a declarative model with a ``__tablename__`` has a Table."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class Node(Base):
    """A GPU node of the hardware inventory."""

    __tablename__ = "nodes"
    # names are case-insensitive (migration 0014): stored in lower case, and unique whatever the case
    __table_args__ = (Index("ix_nodes_lower_name", text("lower(name)"), unique=True),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    gpu_id: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[dict[str, Any]] = mapped_column(JSON)  # resolved catalogue facts (or the inline description)
    gpu_count: Mapped[int] = mapped_column(Integer)
    interconnect: Mapped[str | None] = mapped_column(String(16), nullable=True)
    address: Mapped[str | None] = mapped_column(String(253), nullable=True)  # IP or DNS name other nodes reach
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    gpus: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # as nvidia-smi last reported
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Token(Base):
    """A bearer token, stored only as its SHA-256 hash."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | deployer | agent | auditor
    node_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    label: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Manifest(Base):
    """A weight manifest: a model version's config.json facts, quantization tag, layout, size and location."""

    __tablename__ = "manifests"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_manifests_name_version"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(128))
    uri: Mapped[str] = mapped_column(String(2048))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    quantization_txt: Mapped[str | None] = mapped_column(Text, nullable=True)
    hf_quant_config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JSON)
    weights_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    digests: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    digest: Mapped[str] = mapped_column(String(80))  # sha256 over the canonical manifest
    allow_remote_code: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    files: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # weights files (agent/weights.py)
    # the tensor inventory from the safetensors headers: layout digest, totals, format (domain/tensors.py)
    tensors: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Plan(Base):
    """An accepted, signed launch plan (rejected requests are never stored)."""

    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    manifest_id: Mapped[int] = mapped_column(ID, ForeignKey("manifests.id"))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    verdict: Mapped[str] = mapped_column(String(8))
    findings: Mapped[list[Any]] = mapped_column(JSON)
    argv: Mapped[list[Any]] = mapped_column(JSON)
    command: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    budget: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # what Preflight filled in and why ([{"field", "value", "why"}]); null for plans older than migration 0007
    recommendations: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    vllm_version: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | superseded | revoked
    # form, nodes per instance, groups (nodes, head, head address, digest), per-group env (domain/topology.py)
    topology: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the tuning memo of a plan made by the tuning loop or with a tuning block (domain/tuning.py Memo)
    tuning: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # how its nodes check the weights, as asked at creation: {"mode": "verify"} or {"mode": "skip", "reason",
    # "requested_by"} (audited plan.weights_check_skipped); null for plans older than migration 0016
    weights_check: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the policy profile that judged it ({"name", "digest"}: domain/policy_profile.py) and, for a launch posted as an
    # argv, what was posted ({"argv", "engine_args"}: the argv as given and the engine arguments it was read as);
    # null for plans older than migration 0018 (given: also for launches posted as engine_args)
    policy: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    given: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Assignment(Base):
    """A plan assigned to one node, with that node's signed JWS and its per-node sequence number."""

    __tablename__ = "assignments"
    __table_args__ = (
        UniqueConstraint("node_name", "seq", name="uq_assignments_node_seq"),
        Index("ix_assignments_node_status", "node_name", "status"),
    )
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"), index=True)
    node_name: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(Integer)
    signed: Mapped[str] = mapped_column(Text)
    # the freshness statement signed with the plan (service/api/routers/agent.py serves it while it is young enough)
    freshness: Mapped[str | None] = mapped_column(Text, nullable=True)
    etag: Mapped[str] = mapped_column(String(80))
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | superseded | revoked
    last_report: Mapped[str | None] = mapped_column(String(16), nullable=True)
    first_fetched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_fetched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    fetch_count: Mapped[int] = mapped_column(Integer, default=0)  # fetches recorded (see plans._record_fetch)
    last_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # the node's place in the plan's topology: group (instance), rank in it, role (replica | head | worker) and the
    # digest over the whole group's signed content (the same on every member)
    group_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    group_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Report(Base):
    """What a node agent reported about a plan."""

    __tablename__ = "reports"
    __table_args__ = (Index("ix_reports_node_name_id", "node_name", "id"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    plan_id: Mapped[str] = mapped_column(String(36), index=True)
    node_name: Mapped[str] = mapped_column(String(128), index=True)
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MetricWindow(Base):
    """One window of vLLM's live metrics, as the node's agent computed it from /metrics: gauges at the
    window's end, counter deltas over it, P99s from histogram bucket deltas. A bounded number per node
    (services/tuning.py prunes by count)."""

    __tablename__ = "metric_windows"
    __table_args__ = (Index("ix_metric_windows_node_name_id", "node_name", "id"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    node_name: Mapped[str] = mapped_column(String(128))
    plan_id: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    window_s: Mapped[float] = mapped_column(Float)
    running: Mapped[float] = mapped_column(Float)
    waiting: Mapped[float] = mapped_column(Float)
    kv_usage: Mapped[float] = mapped_column(Float)
    preemptions: Mapped[float] = mapped_column(Float)
    ttft_p99_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    e2e_p99_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    gen_tokens_per_s: Mapped[float] = mapped_column(Float)


class AuditEvent(Base):
    """One event of the hash-chained audit log (service/audit.py). ``chain_seq``, ``prev_hash`` and ``hash`` are
    set when the event is sealed into the chain, moments after its transaction commits."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_node_id", "node", "id"),
        Index("ix_audit_events_plan_id", "plan_id", "id"),
        Index("ix_audit_events_model_id", "model", "id"),
        Index("ix_audit_events_subject_id", "subject", "id"),
        Index("ix_audit_events_ts", "ts"),
        Index("ix_audit_events_nonce", "nonce"),  # the sealer's look-up for copies of a row (audit/sealing.py)
        # the sealer's work list: only unsealed events are in it, so finding them never scans the chain
        Index(
            "ix_audit_events_pending",
            "id",
            postgresql_where=text("chain_seq IS NULL"),
            sqlite_where=text("chain_seq IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    ts: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(256))  # "agent:<node name of up to 128 characters>" fits
    kind: Mapped[str] = mapped_column(String(48))
    subject: Mapped[str] = mapped_column(String(512))  # "manifest:<name ≤ 256>@<version ≤ 128>" fits
    node: Mapped[str | None] = mapped_column(String(128), nullable=True)
    plan_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)  # manifest name, for "which config ran where"
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    payload_digest: Mapped[str] = mapped_column(String(64))
    # "<kid>.<hex HMAC-SHA256>" over the event's fields with a secret bound to the signing keys: set when the
    # service writes the event, so a row inserted by anyone else is never sealed and is reported by verify
    mac: Mapped[str | None] = mapped_column(String(96), nullable=True)
    # random, written at append and covered by the MAC (null on rows older than migration 0015): a copy of a row
    # carries the same nonce, and the sealer seals only the first row with a given nonce
    nonce: Mapped[str | None] = mapped_column(String(32), nullable=True)
    chain_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True, unique=True)
    prev_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    hash: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)


class AuditHead(Base):
    """The audit chain's sealed head (one row, id 1): the last sealed seq and hash, rewritten with a MAC by the
    transaction that seals, under the chain lock. Every process and verify compare the chain's end with it, so a
    deleted tail shows without an in-memory note of whoever sealed it (service/audit/head.py)."""

    __tablename__ = "audit_head"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    mac: Mapped[str | None] = mapped_column(String(128), nullable=True)  # null: written by migration 0015, unsigned
    updated_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class AuditCheckpoint(Base):
    """A signed checkpoint of the audit chain (RFC 6962's signed tree head): its length, head hash and a digest of
    the event ids in chain order, signed with the service key. Made automatically by the sealer (service/audit.py)
    and also written to a file in the data dir, so that a cut of the chain's tail shows against either copy."""

    __tablename__ = "audit_checkpoints"
    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    events: Mapped[int] = mapped_column(BigInteger)
    head: Mapped[str] = mapped_column(String(64))
    ids_digest: Mapped[str] = mapped_column(String(64))
    kid: Mapped[str] = mapped_column(String(128))
    signed: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class IdempotencyKey(Base):
    """A replayable response for ``Idempotency-Key`` on POST /v1/plans and /v1/manifests: the first request with a
    key stores its body hash and response in the same transaction as the write it made."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("route", "key", name="uq_idempotency_keys_route_key"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    route: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(256))
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Calibration(Base):
    """Predicted vs printed KV cache for one plan on one node (from the agent's report of vLLM's start-up log)."""

    __tablename__ = "calibration"
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    plan_id: Mapped[str] = mapped_column(String(36), index=True)
    node_name: Mapped[str] = mapped_column(String(128))
    gpu_id: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256))
    predicted_kv_tokens: Mapped[int] = mapped_column(BigInteger)
    actual_kv_tokens: Mapped[int] = mapped_column(BigInteger)
    predicted_kv_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    actual_kv_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    relative_error: Mapped[float] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CacheEpoch(Base):
    """A counter per kind of cached state (``plans``, ``tokens``), bumped in every transaction that changes it; each
    service process polls the counters and drops what it cached under an older value (services/epochs.py)."""

    __tablename__ = "cache_epochs"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)


class Rollout(Base):
    """A staged rollout: a plan target changed over its nodes in waves, gated by the agents' reports and
    rolled back by itself (service/domain/rollout.py states; services/rollouts.py steps)."""

    __tablename__ = "rollouts"
    __table_args__ = (Index("ix_rollouts_state", "state"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # pending | waiting | baking | paused | halted | rolling_back | aborting | completed | rolled_back | aborted
    state: Mapped[str] = mapped_column(String(16))
    wave: Mapped[int] = mapped_column(Integer, default=-1)  # the current wave's index; -1 before the first
    paused_from: Mapped[str | None] = mapped_column(String(16), nullable=True)
    promote: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    target: Mapped[dict[str, Any]] = mapped_column(JSON)  # the plan body without nodes
    selector: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # how the nodes were chosen
    waves: Mapped[list[Any]] = mapped_column(JSON)  # [{"percent", "bake_s"}]
    failure_limit: Mapped[int] = mapped_column(Integer)
    gates: Mapped[dict[str, Any]] = mapped_column(JSON)
    bake_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # why it halted, was aborted, …
    steps: Mapped[int] = mapped_column(Integer, default=0)  # transitions made
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RolloutWave(Base):
    """One wave of a rollout: its share, bake, state and the plans signed for it (recorded in the transaction that
    signed them, so a restarted scheduler never signs a wave twice)."""

    __tablename__ = "rollout_waves"
    __table_args__ = (UniqueConstraint("rollout_id", "index", name="uq_rollout_waves_rollout_id_index"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"))
    index: Mapped[int] = mapped_column(Integer)
    percent: Mapped[int] = mapped_column(Integer)
    bake_s: Mapped[int] = mapped_column(Integer)
    # pending | waiting | baking | done | skipped | halted | aborted | cancelled (not started when the rollout ended)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    plan_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    signed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    settled_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    done_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RolloutNode(Base):
    """A node of a rollout: its unit and wave, the plan it had before (``previous_plan_id``), the one the rollout
    signed it (``new_plan_id``), the one that restored it, and the outcome with its evidence."""

    __tablename__ = "rollout_nodes"
    __table_args__ = (
        UniqueConstraint("rollout_id", "node_name", name="uq_rollout_nodes_rollout_id_node_name"),
        Index("ix_rollout_nodes_node_name", "node_name"),
    )
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"))
    node_name: Mapped[str] = mapped_column(String(128))
    position: Mapped[int] = mapped_column(Integer)
    unit: Mapped[int] = mapped_column(Integer)
    wave: Mapped[int] = mapped_column(Integer)
    head: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))  # its unit's head
    previous_plan_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    new_plan_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    new_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    restored_plan_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    restored_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # unchanged | pending | ready | failed | restored | not_restored
    outcome: Mapped[str] = mapped_column(String(32), default="unchanged")
    failed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))  # counted a failure
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    signed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
