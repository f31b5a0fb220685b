"""What vLLM's own ``vllm serve`` parser makes of every prefix of every option string: the option it abbreviates,
"ambiguous" (with argparse's message) or nothing. Preflight's abbreviation matching (service/domain/engine_args.py
``abbreviations``) is compared with it by tests/domain/test_abbreviations.py.

    python scripts/check_abbrev_with_vllm.py        # where vLLM is importable (e.g. the generator's environment with
                                                    # PYTHONPATH=/tmp/preflight-vllm-gen/releases/0.33.0); JSON on stdout

The parser is the one scripts/vllm_catalogue_inside.py builds; each prefix goes through argparse's own
``_parse_optional`` (the step that matches abbreviations) of the Python running this script.
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import vllm_catalogue_inside as inside  # noqa: E402


class Refused(Exception):
    pass


def prefixes(strings: list[str]) -> list[str]:
    """Every prefix of every option string, from ``--x`` / ``-x`` on."""
    return sorted({s[:n] for s in strings for n in range(3 if s.startswith("--") else 2, len(s) + 1)})


def main() -> int:
    parser = inside.build_serve_parser()

    def error(message: str) -> None:
        raise Refused(message)

    parser.error = error  # type: ignore[method-assign]
    out: dict[str, list[str]] = {}
    for p in prefixes(list(parser._option_string_actions)):
        try:
            found = parser._parse_optional(p)
        except Refused as e:
            out[p] = ["ambiguous", str(e)]
            continue
        out[p] = ["none"] if found is None or found[0] is None else ["option", found[1]]
    json.dump(
        {
            "vllm_version": importlib.metadata.version("vllm"),
            "python": sys.version.split()[0],
            "allow_abbrev": parser.allow_abbrev,
            "prefixes": out,
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
