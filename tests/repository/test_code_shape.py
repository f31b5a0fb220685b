"""The shape the code keeps: functions a reader takes in at once, and a repository that stands alone (nothing points
to folders outside it, so a clone has every fact it cites)."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
LONGEST_FUNCTION = 80


def _functions(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_in_the_service_is_longer_than_a_screen():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted((ROOT / "service").rglob("*.py"))
        for name, line, length in _functions(path)
        if length > LONGEST_FUNCTION
    ]
    assert long == []


def test_the_measure_sees_long_functions(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n")
    assert [(n, length) for n, _, length in _functions(tmp_path / "m.py")] == [("long", LONGEST_FUNCTION + 1)]


def _tracked_files() -> list[pathlib.Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_nothing_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|/work/shared")
    pointing = []
    for path in _tracked_files():
        if path == pathlib.Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if outside.search(text):
            pointing.append(str(path.relative_to(ROOT)))
    assert pointing == []
