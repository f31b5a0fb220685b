"""Weight manifests."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Out


class ManifestOut(Out):
    id: int = Field(description="Manifest id.")
    name: str = Field(description="The model's name.")
    version: str = Field(description="The weight version.")
    uri: str = Field(description="Where nodes load the weights from.")
    digest: str = Field(description="sha256 over the manifest as registered (signed into every plan).")
    checkpoint: dict[str, Any] = Field(description="How the weights are laid out on disk.")
    weights_bytes: int | None = Field(description="Total size of the weight files in bytes, when given.")
    allow_remote_code: bool = Field(description="Whether production plans may set trust_remote_code.")
    created_at: str | None = Field(description="When it was registered (ISO 8601).")
    quantization: str | None = Field(
        default=None,
        description=("The quantization its quantization.txt names (present when it has one; null: unquantized)."),
    )
    layout_digest: str | None = Field(
        default=None,
        description="SHA-256 over its tensors' (name, dtype, shape), from the safetensors headers (when registered with them).",
    )
    tensor_format: str | None = Field(
        default=None,
        description="The quantization layout its tensors show (gptq, awq, fp8, nvfp4, …; none: unquantized).",
    )


class ManifestFullOut(ManifestOut):
    config: dict[str, Any] = Field(description="The model's config.json object.")
    quantization_txt: str | None = Field(description="The quantization.txt as registered.")
    hf_quant_config: dict[str, Any] | None = Field(description="hf_quant_config.json, when the checkpoint has one.")
    digests: dict[str, Any] = Field(description="Digests of the weight files by name (as given).")
    files: dict[str, Any] | None = Field(
        default=None,
        description=("The weights files every node checks before vLLM starts (present when registered with them)."),
    )
    tensors: dict[str, Any] | None = Field(
        default=None,
        description="The tensor inventory from the safetensors headers: layout digest, totals by dtype and file, format.",
    )


class ManifestListOut(Out):
    items: list[ManifestOut] = Field(description="Manifests by id.")
    next: int | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")
