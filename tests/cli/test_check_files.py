"""``preflight check``'s file reading (service/cli/check_files.py): a file that never ends or is too large is bad
input (exit 2) in bounded time and memory, not a hang."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from service.cli import check_files
from service.cli.check_files import check_files as run_check
from tests.support import MODELS


def test_a_request_file_that_never_ends_is_bad_input(tmp_path):
    endless = tmp_path / "zero.json"
    os.symlink("/dev/zero", endless)
    out: list[str] = []
    assert run_check([endless], as_json=True, echo=out.append) == 2
    [line] = out
    assert json.loads(line)["errors"] == [
        {
            "field": "file",
            "rule": "invalid_json",
            "message": (f"the file is larger than {check_files.MAX_FILE_BYTES} bytes"),
        }
    ]


def test_a_model_directory_file_over_the_limit_is_bad_input(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((MODELS / "microsoft__Phi-3-medium-4k-instruct" / "config.json").read_text())
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"model": {"path": str(model)}, "hardware": {"gpu": "a100-sxm4-80gb", "count": 1}}))
    monkeypatch.setattr(check_files, "MAX_FILE_BYTES", 512)
    out: list[str] = []
    assert run_check([req], as_json=True, echo=out.append) == 2
    assert json.loads(out[0])["errors"][0]["message"] == "the file is larger than 512 bytes"


@pytest.mark.parametrize("text", ["\ufeff{}", '{"a": 1'])
def test_small_files_still_read_as_before(tmp_path, text):
    p = pathlib.Path(tmp_path / "f.json")
    p.write_text(text, encoding="utf-8")
    out: list[str] = []
    assert run_check([p], as_json=True, echo=out.append) == 2
    assert json.loads(out[0])["errors"][0]["rule"] == "invalid_json"
