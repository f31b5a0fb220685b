"""Runs INSIDE a throw-away environment that has one Transformers release (and a CPU torch): writes, as JSON on
stdout, every model class that ``getattr(transformers, name)`` returns and what vLLM asks of it before its
Transformers backend takes an architecture. Started by scripts/gen_transformers_models.py; never imported by the
service.

vLLM resolves an architecture its registry does not name with ``getattr(transformers, architecture)`` and then
asks the class (vllm 0.33.0 vllm/model_executor/models/registry.py:1297-1341; 0.10.2 registry.py:568-600;
0.9.2 vllm/model_executor/model_loader/utils.py:191-219; 0.7.3 model_loader/utils.py:33-42). Per class, as letters:

- ``b``: ``cls.is_backend_compatible()`` is true (``_supports_attention_backend``)
- ``s``: ``cls._can_set_attn_implementation()`` is true (asked on a class with no cached answer, as vLLM asks it
  once per process)
- ``f``: ``cls._supports_flex_attn`` is true (what vLLM 0.7 asks when the class has no ``supports_backend``)
- ``k``: the class has a ``supports_backend`` attribute
- ``?``: the name is exported but its class could not be imported here (a dummy for a missing optional
  dependency, or an import error): what it answers is unknown. TensorFlow and Flax classes are not listed.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

CACHE = "_can_set_attn_implementation_cached_value"
MODEL_WORDS = ("For", "Model", "LMHead")


def _fresh_can_set(cls) -> bool | None:
    """``_can_set_attn_implementation()`` as a fresh process answers it: the answer is cached on the class it was
    asked of, and a subclass would otherwise read its parent's."""
    if not hasattr(cls, "_can_set_attn_implementation"):
        return None
    for klass in cls.__mro__:
        if CACHE in vars(klass):
            delattr(klass, CACHE)
    try:
        return bool(cls._can_set_attn_implementation())
    except Exception:
        return False
    finally:
        if CACHE in vars(cls):
            delattr(cls, CACHE)


def _backend_compatible(cls) -> bool:
    """vLLM calls ``is_backend_compatible()``; a Transformers without it fails the call (false here)."""
    try:
        return hasattr(cls, "is_backend_compatible") and bool(cls.is_backend_compatible())
    except Exception:
        return False


def flags(cls) -> str:
    out = ""
    if _backend_compatible(cls):
        out += "b"
    if _fresh_can_set(cls):
        out += "s"
    if getattr(cls, "_supports_flex_attn", False) is True:
        out += "f"
    if hasattr(cls, "supports_backend"):
        out += "k"
    return out


def _dummy_of_torch(obj) -> bool:
    """A placeholder for a class whose optional dependency is missing here; TensorFlow and Flax classes are left
    out (vLLM runs PyTorch classes only)."""
    if type(obj).__name__ != "DummyObject":
        return False
    return not set(getattr(obj, "_backends", ())) <= {"tf", "flax"}


def model_classes() -> dict[str, str]:
    import transformers
    from transformers import PreTrainedModel

    out: dict[str, str] = {}
    for name in sorted(dir(transformers)):
        if not name[:1].isupper():
            continue
        try:
            obj = getattr(transformers, name)
        except Exception:
            obj = None
        if isinstance(obj, type) and issubclass(obj, PreTrainedModel):
            out[name] = flags(obj)
        elif (obj is None or _dummy_of_torch(obj)) and any(w in name for w in MODEL_WORDS):
            out[name] = "?"
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    import transformers

    classes = model_classes()
    json.dump({"transformers_version": transformers.__version__, "classes": classes}, sys.stdout)


if __name__ == "__main__":
    main()
