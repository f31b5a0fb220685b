"""``quantization.txt``: the tag file every quantized weight version ships, naming its format (docs/operating.md §8).

Format (one UTF-8 text file, at the root of the weight directory):
- ``#`` starts a comment (whole line or trailing); blank lines are ignored;
- the first remaining line is the vLLM quantization method name (``--quantization``), case-insensitive
  (e.g. ``awq``, ``gptq``, ``fp8``, ``modelopt``, ``compressed-tensors``); ``none`` marks unquantized weights;
- any following lines are ``key=value`` pairs (e.g. ``bits=4``, ``group_size=128``), kept as strings.

Deploy tooling reads the tag and passes ``--quantization`` from it; nobody types the flag by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import DomainError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class QuantTag:
    """A parsed quantization.txt: ``method`` lower-cased (``None`` for ``none``), ``params`` its key=value lines."""

    method: str | None
    params: dict[str, str] = field(default_factory=dict)


def parse_quantization_txt(
    text: str, accepted: tuple[str, ...], field_name: str = "model.quantization_txt"
) -> QuantTag:
    """Parse the tag file text.

    ``accepted`` is the target version's quantization method names. Raises DomainError when the file is empty,
    names an unknown method (listing the accepted ones) or has a malformed ``key=value`` line.
    """
    lines = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    if not lines:
        raise DomainError(
            field_name, "quantization.txt has no method line (only comments or blank)", rule="quant_tag_empty"
        )
    method = lines[0].lower()
    if method != "none" and method not in accepted:
        raise DomainError(
            field_name,
            f"quantization.txt names {lines[0]!r}, which is not a vLLM quantization method",
            rule="quant_unknown",
            accepted=["none", *accepted],
        )
    params: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition("=")
        if not sep or not _KEY.match(key.strip()):
            raise DomainError(field_name, f"quantization.txt line {line!r} is not key=value", rule="quant_tag_syntax")
        params[key.strip().lower()] = value.strip()
    return QuantTag(method=None if method == "none" else method, params=params)
