"""The Transformers model classes a vLLM release can fall back to, from data generated from the Transformers
releases it allows (scripts/gen_transformers_models.py; nothing here is typed by hand).

``service/data/vllm/transformers/releases.json`` says, per vLLM release: its wheel's Transformers requirement, the
oldest and the newest published Transformers that requirement allows, where the release looks an architecture up
in Transformers (None: it never does, 0.6) and its architecture-suffix table (``_SUFFIX_TO_DEFAULTS``, 0.10 on).
``<transformers version>.json`` lists every model class ``getattr(transformers, name)`` returns in that release,
each with letters for what vLLM asks of it: ``b`` ``is_backend_compatible()``, ``s``
``_can_set_attn_implementation()``, ``f`` ``_supports_flex_attn``, ``k`` has ``supports_backend``; ``?`` the class
could not be imported where the data was generated (unknown).

Which Transformers is installed next to vLLM is not known before launch: a class is taken for granted only when
both the oldest and the newest allowed release have it and answer alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from .versions import DATA_DIR

TRANSFORMERS_DIR = DATA_DIR / "transformers"


@dataclass(frozen=True)
class ReleaseTransformers:
    """What one vLLM release's Transformers fallback can find."""

    requirement: str  # the wheel's Requires-Dist specifier, e.g. ">=4.55.2"
    versions: tuple[str, ...]  # the oldest and the newest published Transformers it allows
    classes: tuple[Mapping[str, str], ...]  # per version: class name -> flags
    fallback: str | None  # where the release calls getattr(transformers, arch); None: no fallback
    suffixes: tuple[tuple[str, str, str], ...]  # (suffix, default runner, default convert), vLLM's order
    suffixes_at: str

    @property
    def span(self) -> str:
        return "–".join(self.versions)


@cache
def _releases() -> dict[str, Any]:
    path = TRANSFORMERS_DIR / "releases.json"
    return json.loads(path.read_text()) if path.exists() else {}


@cache
def _classes(transformers_version: str) -> Mapping[str, str] | None:
    path = TRANSFORMERS_DIR / f"{transformers_version}.json"
    if not path.exists():
        return None
    classes = json.loads(path.read_text())["classes"]
    return {str(k): str(v) for k, v in classes.items()}


@cache
def release_transformers(vllm_version: str) -> ReleaseTransformers | None:
    """The release's Transformers facts; None where Preflight has no data for it (then nothing is concluded)."""
    entry = _releases().get(vllm_version)
    if entry is None:
        return None
    versions = tuple(entry["transformers"])
    found = [_classes(v) for v in versions] if entry.get("transformers_fallback") else []
    if any(c is None for c in found):
        return None
    suffixes = entry.get("suffix_defaults") or {}
    return ReleaseTransformers(
        requirement=entry["requirement"],
        versions=versions,
        classes=tuple(c for c in found if c is not None),
        fallback=entry.get("transformers_fallback"),
        suffixes=tuple((s, r, c) for s, r, c in suffixes.get("table") or ()),
        suffixes_at=suffixes.get("at", ""),
    )
