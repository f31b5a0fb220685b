"""vLLM's own config YAML (``vllm serve --config FILE``; vllm/utils/argparse_utils.py:606-673): given alone, the
``model:`` key names the model and the file is the launch. ``key_spans`` places each top-level key for the findings
about the option it sets (PyYAML's composer, the parser vLLM reads the file with, keeps the marks)."""

from __future__ import annotations

from typing import Any

from .found import FoundLaunch, Span, Word


def key_spans(text: str, file: str) -> dict[str, Span]:
    """Each top-level key of a YAML mapping → where it is written (nothing for a file that is no mapping)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {
        str(k.value): Span(file, k.start_mark.line + 1, k.start_mark.column + 1)
        for k, _ in node.value
        if isinstance(k, yaml.ScalarNode)
    }


def looks_like_vllm_config(data: Any) -> bool:
    """A mapping with a top-level ``model`` key that is no other kind read here: vLLM's config YAML, whatever its
    other keys (a mistyped one is vLLM's "unrecognized arguments", refused at the key — never a file skipped)."""
    if not isinstance(data, dict) or "model" not in data:
        return False
    return not ({"apiVersion", "kind", "services", "servingEngineSpec"} & set(map(str, data)))


def read_vllm_config(text: str, file: str, path: str) -> FoundLaunch:
    """The launch a config file describes: ``vllm serve --config PATH`` (the parse reads the file's keys)."""
    spans = key_spans(text, file)
    at = spans.get("model", Span(file, 1, 1))
    return FoundLaunch(kind="vllm-config", at=at, words=[Word("vllm"), Word("serve"), Word("--config"), Word(path, at)])
