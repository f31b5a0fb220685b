"""Service settings, from the environment (prefix ``PREFLIGHT_``) via pydantic-settings.

| variable | default | meaning |
|---|---|---|
| PREFLIGHT_DATA_DIR | ./var | signing keys and the embedded SQLite database |
| PREFLIGHT_DATABASE_URL | sqlite:///<data dir>/preflight.db | SQLAlchemy URL; production: postgresql+psycopg://… |
| PREFLIGHT_ADMIN_TOKEN | generated on first start, stored hashed, printed once | bootstrap admin bearer token |
| PREFLIGHT_ENV | development | ``production`` refuses insecure defaults (no SQLite, an explicit admin token and key path) |
| PREFLIGHT_SIGNING_KEY_DIR | <data dir>/keys | Ed25519 private keys (JWK files, mode 0600) |
| PREFLIGHT_ISSUER | preflight | ``iss`` of signed plans |
| PREFLIGHT_AUDIENCE | preflight-agent | ``aud`` of signed plans |
| PREFLIGHT_FRESHNESS_TTL_SECONDS | 3600 | lifetime of the freshness statement served with a plan (plans never expire) |
| PREFLIGHT_MAX_BODY_BYTES | 2097152 | largest accepted request body |
| PREFLIGHT_AUDIT_CHECKPOINT_EVENTS | 10000 | a signed audit checkpoint at least every N events |
| PREFLIGHT_AUDIT_CHECKPOINT_SECONDS | 60 | ... and at most T seconds after the chain last grew |
| PREFLIGHT_TUNING | {} | the tuning loop's thresholds and steps as JSON over the defaults (domain/tuning.py TuningSettings: ``{"step_fraction": 0.2, "windows": 5, "fail_windows": 3}``) |
| PREFLIGHT_ROLLOUT_TICK_SECONDS | 5 | how often each service process steps the staged rollouts (0: never) |
| PREFLIGHT_POLICY_FILE | (the shipped profile) | a policy profile (TOML): which operators' rules refuse, warn or are off per environment (domain/policy_profile.py); read at start-up, a bad file stops the service naming the file and key |
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from .domain.policy_profile import Profile
    from .domain.tuning import TuningSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PREFLIGHT_", extra="ignore")

    env: Literal["development", "production"] = "development"
    data_dir: pathlib.Path = pathlib.Path("var")
    database_url: str | None = None
    admin_token: str | None = Field(default=None, min_length=16)
    signing_key_dir: pathlib.Path | None = None
    issuer: str = "preflight"
    audience: str = "preflight-agent"
    freshness_ttl_seconds: int = Field(default=3600, ge=120, le=7 * 86400)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    audit_checkpoint_events: int = Field(default=10_000, ge=1, le=10_000_000)
    audit_checkpoint_seconds: float = Field(default=60.0, ge=0.1, le=86400)
    tuning: dict[str, float | int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _tuning_settings(self) -> Settings:
        self.tuning_settings  # noqa: B018 — refuse unknown names or values out of range at start-up
        return self

    @property
    def tuning_settings(self) -> TuningSettings:
        """The tuning loop's settings: the guide's defaults with PREFLIGHT_TUNING's values over them."""
        from .domain.tuning import TuningSettings

        counts = {f.name for f in dataclasses.fields(TuningSettings) if type(f.default) is int}
        fractional = sorted(k for k, v in self.tuning.items() if k in counts and not isinstance(v, int))
        if fractional:  # a count (windows, max_steps) indexes and slices: 2.5 passed the range checks, then broke
            raise ValueError(f"PREFLIGHT_TUNING: {', '.join(fractional)} must be a whole number")
        values: dict[str, Any] = dict(self.tuning)  # each count checked above to be an int
        try:
            return TuningSettings(**values)
        except TypeError as exc:
            raise ValueError(f"PREFLIGHT_TUNING: {exc}") from None

    rollout_tick_seconds: float = Field(default=5.0, ge=0, le=3600)
    policy_file: pathlib.Path | None = None
    _policy: Profile | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _policy_profile(self) -> Settings:
        from .domain.policy_profile import ProfileError, default_profile, load_profile

        try:  # read once, at start-up: a bad file stops the service here, naming the file and key
            self._policy = load_profile(self.policy_file) if self.policy_file else default_profile()
        except ProfileError as exc:
            raise ValueError(f"PREFLIGHT_POLICY_FILE: {exc}") from None
        return self

    @property
    def policy(self) -> Profile:
        """The policy profile every launch is judged under (PREFLIGHT_POLICY_FILE, else the shipped one)."""
        from .domain.policy_profile import default_profile

        return self._policy or default_profile()

    @model_validator(mode="after")
    def _production_is_explicit(self) -> Settings:
        if self.env == "production":
            problems = []
            if not self.database_url or self.database_url.startswith("sqlite"):
                problems.append("PREFLIGHT_DATABASE_URL must name a PostgreSQL database")
            if not self.admin_token:
                problems.append("PREFLIGHT_ADMIN_TOKEN must be set (no generated token in production)")
            if not self.signing_key_dir:
                problems.append("PREFLIGHT_SIGNING_KEY_DIR must be set (no generated key in production)")
            if problems:
                raise ValueError("production mode refuses insecure defaults: " + "; ".join(problems))
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'preflight.db').resolve()}"

    @property
    def checkpoint_file(self) -> pathlib.Path:
        """The newest signed audit checkpoint, kept outside the database (service/audit.py)."""
        return self.data_dir / "audit-checkpoint.jws"

    @property
    def key_dir(self) -> pathlib.Path:
        return self.signing_key_dir or (self.data_dir / "keys")
