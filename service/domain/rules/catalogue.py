"""The rule catalogue as Markdown (``docs/rules.md``), generated from the registry:
``python -m service.domain.rules.catalogue > docs/rules.md``. tests/domain/rules/test_catalogue.py keeps the file current.
"""

from __future__ import annotations

import sys

from ..policy_profile import OPERATING_SOURCE
from . import RULES


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def render_markdown() -> str:
    """One table row per registered rule: code(s), worst severity, phase, what it checks (the docstring's first
    paragraph) and the vLLM 0.33.0 source or docs/operating.md section it mirrors. Rows are sorted by first code."""
    lines = [
        "# Preflight rules",
        "",
        "Generated from the rule registry (`service/domain/rules/`) by `python -m service.domain.rules.catalogue`;",
        "do not edit by hand. Codes are those of tests/cases/README.md. Phase `config` rules judge the launch",
        "before the memory budget; phase `budget` rules read it. A severity marked (profile) is an operator rule's:",
        "the policy profile makes it an error, a warning or nothing per environment",
        "([configuration](configuration.md#policy-profiles)).",
        "",
        "| code(s) | severity | phase | what | source |",
        "|---|---|---|---|---|",
    ]
    for info in sorted(RULES, key=lambda r: (r.codes[0], r.name)):
        codes = ", ".join(f"`{c}`" for c in info.codes)
        severity = info.severity + (" (profile)" if info.source.startswith(OPERATING_SOURCE) else "")
        lines.append(f"| {codes} | {severity} | {info.phase} | {_cell(info.what)} | {_cell(info.source)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render_markdown())
