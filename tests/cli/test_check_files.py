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
    """/dev/zero given as the request file: refused for what it is, before a byte is read."""
    endless = tmp_path / "zero.json"
    os.symlink("/dev/zero", endless)
    out: list[str] = []
    assert run_check([endless], as_json=True, echo=out.append) == 2
    [line] = out
    assert json.loads(line)["errors"] == [
        {
            "field": "file",
            "rule": "invalid_json",
            "message": f"cannot read {endless}: not a regular file (a character device)",
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


def _non_regular(path: pathlib.Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        path.mkdir()


KIND_SAID = {"fifo": "a FIFO", "dev-zero": "a character device", "dir": "a directory"}


@pytest.mark.parametrize("kind", sorted(KIND_SAID))
@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "quantization.txt",
        "hf_quant_config.json",
        "model.safetensors.index.json",
        "preprocessor_config.json",
    ],
)
def test_a_model_file_that_is_not_a_regular_file_is_refused_naming_it(tmp_path, name, kind):
    """A model directory's file that is there but no regular file is refused, naming it and what it is: never read
    as absent (a FIFO as quantization.txt would judge an AWQ checkpoint as unquantized) nor waited on."""
    model = tmp_path / "model"
    model.mkdir()
    if name != "config.json":
        (model / "config.json").write_text((MODELS / "microsoft__Phi-3-medium-4k-instruct" / "config.json").read_text())
    _non_regular(model / name, kind)
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"model": {"path": str(model)}, "hardware": {"gpu": "a100-sxm4-80gb", "count": 1}}))
    out: list[str] = []
    assert run_check([req], as_json=True, echo=out.append) == 2
    message = json.loads(out[0])["errors"][0]["message"]
    assert message == f"cannot read {model / name}: not a regular file ({KIND_SAID[kind]})"


def test_resolve_refuses_a_fifo_beside_the_model(tmp_path):
    from service.sources.resolve import ResolveError, resolve_model

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((MODELS / "microsoft__Phi-3-medium-4k-instruct" / "config.json").read_text())
    os.mkfifo(model / "quantization.txt")
    with pytest.raises(ResolveError) as err:
        resolve_model(str(model), env={})
    assert err.value.tried[-1][1] == f"cannot read {model / 'quantization.txt'}: not a regular file (a FIFO)"
