"""Whether a release's ``vllm serve`` parser accepts abbreviated long options, read from the release's source.

    python scripts/vllm_argparse.py RELEASE_DIR        # the unpacked wheel: RELEASE_DIR/vllm/…; JSON on stdout

vLLM's FlexibleArgumentParser subclasses argparse.ArgumentParser (vllm 0.33.0 vllm/utils/argparse_utils.py:156-180;
vllm/utils/__init__.py in 0.9-0.10, vllm/utils.py before) and ``vllm serve``'s parser is one made by
``subparsers.add_parser`` (vllm/entrypoints/cli/serve.py). argparse's ``allow_abbrev`` defaults to True: any unique
prefix of a long option is that option (``_parse_optional`` / ``_get_option_tuples``). Nothing is imported: every
``allow_abbrev`` in the files that build that parser (``SERVE_PARSER``: the parser's module, vllm/entrypoints, the
engine arguments, the 0.6 entry point) is found with ``ast`` and listed with its file and line; any one that does not
set the literal True turns the fact off (the service then refuses abbreviations, as if the parser did). The same for
``add_help`` (argparse's ``-h`` / ``--help``: option strings a prefix is matched against as well). Other parsers of
the release (benchmarks: ``FlexibleArgumentParser(add_help=False)`` in vllm/benchmarks/sweep/startup.py) are not
``vllm serve``'s and are not read.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys
from typing import Any

# where FlexibleArgumentParser is defined, newest layout first (moved to argparse_utils in 0.11)
PARSER_FILES = ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py", "vllm/utils.py")
# the files that make or configure vllm serve's parser (cli/main.py, cli/serve.py, openai/cli_args.py, arg_utils.py;
# vllm/scripts.py was the entry point up to 0.7), besides the parser's own module
SERVE_PARSER = ("vllm/entrypoints", "vllm/engine/arg_utils.py", "vllm/scripts.py")
HELP_STRINGS = ["--help", "-h"]  # argparse.ArgumentParser.__init__ with add_help=True and prefix_chars '-'


def parser_class(root: pathlib.Path) -> tuple[str, ast.ClassDef]:
    """(file relative to ``root``, class node) of FlexibleArgumentParser."""
    for rel in PARSER_FILES:
        path = root / rel
        if path.exists():
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and node.name == "FlexibleArgumentParser":
                    return rel, node
    raise SystemExit(f"{root}: no FlexibleArgumentParser in {', '.join(PARSER_FILES)}")


def _value(node: ast.AST | None) -> Any:
    """A literal value, or the string "?" where the source computes it."""
    try:
        return ast.literal_eval(node) if node is not None else "?"
    except ValueError:
        return "?"


def _sites_in(tree: ast.AST, name: str) -> list[tuple[int, Any]]:
    """(line, value) of every keyword argument ``name=``, assignment to ``.name`` and string ``"name"`` (a kwargs key)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            out.append((node.value.lineno, _value(node.value)))
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == name for t in node.targets
        ):
            out.append((node.lineno, _value(node.value)))
        elif isinstance(node, ast.Constant) and node.value == name:
            out.append((node.lineno, "?"))
    return out


def _serve_files(root: pathlib.Path, parser_file: str) -> list[pathlib.Path]:
    out = [root / parser_file]
    for rel in SERVE_PARSER:
        path = root / rel
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
    return out


def keyword_sites(root: pathlib.Path, name: str, parser_file: str) -> list[dict[str, Any]]:
    """Every place the files of vllm serve's parser name ``name`` (only files that contain the word are parsed)."""
    out = []
    for path in _serve_files(root, parser_file):
        text = path.read_text(errors="replace")
        if name not in text:
            continue
        rel = path.relative_to(root).as_posix()
        out += [{"site": f"{rel}:{line}", "value": value} for line, value in _sites_in(ast.parse(text), name)]
    return out


def argparse_facts(root: pathlib.Path) -> dict[str, Any]:
    """The release's parser facts: ``allow_abbrev`` (true only when no site in the source sets anything but True),
    the ``-h`` / ``--help`` strings argparse adds, and where FlexibleArgumentParser and its ``__init__`` are."""
    rel, cls = parser_class(root)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    abbrev = keyword_sites(root, "allow_abbrev", rel)
    help_ = keyword_sites(root, "add_help", rel)
    return {
        "allow_abbrev": all(s["value"] is True for s in abbrev),
        "allow_abbrev_sites": abbrev,
        "add_help_sites": help_,
        "help_option_strings": HELP_STRINGS if all(s["value"] is not False for s in help_) else [],
        "parser_class": f"{rel}:{cls.lineno}",
        "parser_init": f"{rel}:{init.lineno}-{init.end_lineno}" if init else f"{rel}:{cls.lineno} (argparse's)",
        "read_from": "source",
    }


if __name__ == "__main__":
    json.dump(argparse_facts(pathlib.Path(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
    print()
