"""Request and response bodies of the HTTP API (unknown fields are refused)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..domain.jsoncheck import check_json
from ..domain.request import ENV_NAME, Checkpoint, CustomGpu, Workload

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class Strict(BaseModel):
    """Unknown fields refused; every value plain JSON (finite numbers, integers within ±2^53, no NUL)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        check_json(data)
        return data


class NodeIn(Strict):
    name: str = Field(pattern=NAME, description="Node name (hostname-like).")
    gpu: str | CustomGpu = Field(description="Catalogue id, nvidia-smi name, or an inline description.")
    gpu_count: Annotated[int, Field(ge=1, le=64)]
    interconnect: Literal["nvlink", "pcie"] | None = None
    labels: dict[str, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=64)


class ManifestIn(Strict):
    name: str = Field(min_length=1, max_length=256)
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
    uri: str = Field(min_length=1, max_length=2048, description="Where nodes load the weights from.")
    config: dict[str, Any] = Field(description="The model's config.json object.")
    quantization_txt: str | None = Field(default=None, max_length=65536)
    hf_quant_config: dict[str, Any] | None = None
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    weights_bytes: Annotated[int, Field(ge=0, le=1 << 50)] | None = None
    digests: dict[str, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=4096)


class PlanIn(Strict):
    manifest: str | Annotated[int, Field(ge=1, le=2**62)] | dict[str, str] = Field(
        description="Manifest id, name@version, or name (newest).")
    nodes: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1, max_length=256)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for vLLM (A-Z, 0-9, _).")
    environment: Literal["production", "benchmark"] = "production"
    workload: Workload | None = None
    vllm_version: str | None = Field(default=None, max_length=32)


    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not ENV_NAME.fullmatch(key) or len(value) > 4096:
                raise ValueError(f"env: {key!r} is not a valid environment variable name (A-Z, 0-9, _) "
                                 "or its value is longer than 4096")
        return env


class ReportIn(Strict):
    plan_id: str = Field(min_length=1, max_length=36)
    status: Literal["fetched", "started", "running", "failed"]
    message: str | None = Field(default=None, max_length=65536)
    details: dict[str, Any] = Field(default_factory=dict)


class TokenIn(Strict):
    role: Literal["admin", "deployer", "auditor"]
    label: str | None = Field(default=None, max_length=256)


class NodeUpdate(Strict):
    gpu_count: Annotated[int, Field(ge=1, le=64)] | None = None
    interconnect: Literal["nvlink", "pcie"] | None = None
    labels: dict[str, Annotated[str, Field(max_length=256)]] | None = Field(default=None, max_length=64)
