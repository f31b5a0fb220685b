"""The plan's weights expectation (service/domain/weights_expect.py) against the weights on disk
(service/agent/weights.py ``check_expected``, bootcheck.py): config.json's canonical digest from the registered config
and from the file, the quantization tag (no file: none), the layout digest through a reader hook, and a node with
nothing to compare — refused for a production plan unless it was signed with weights_check skip. Hostile files and
malformed claims are refusals naming the file or the claim, never a crash."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from service.agent import weights as w
from service.agent.bootcheck import claim_problem, run_checks
from service.domain import weights_expect as we
from service.domain.gpus import lookup
from service.domain.node_checks import hardware_claim
from tests.support.gpus import MODELS, install_nvidia_smi, odd, weights_dir

LLAMA = "meta-llama__Meta-Llama-3.1-8B"
AWQ_STYLE = "Qwen__Qwen3-235B-A22B-FP8"  # a quantized checkpoint's config (quantization_config in config.json)


def registered(model: str = LLAMA) -> dict:
    """The config object as POST /v1/manifests stores it: the fixture's config.json parsed."""
    return json.loads((MODELS / model / "config.json").read_text())


def expected(model: str = LLAMA, *, tag: str | None = None, environment="production", **kw) -> dict:
    return we.weights_expected_claim(
        config=registered(model), quantization_txt=tag, layout_digest=None, environment=environment, **kw
    )


# --- the claim -------------------------------------------------------------------------------------------------------


def test_the_config_digest_is_the_same_from_the_registered_object_and_from_the_file(tmp_path):
    d = weights_dir(tmp_path / "m")
    text = (d / "config.json").read_text()
    want = we.config_digest(registered())
    assert want is not None and we.DIGEST.fullmatch(want)
    assert w._config_digest_on_disk(d) == (want, None)
    # whitespace and key order are not the config: rewritten with another layout, the same digest
    (d / "config.json").write_text(json.dumps(dict(reversed(list(json.loads(text).items()))), indent=7))
    assert w._config_digest_on_disk(d) == (want, None)
    # a value is: Llama-3.1-8B's rope_theta 500000.0 → 10000.0 is another model
    changed = {**registered(), "rope_theta": 10000.0}
    assert registered()["rope_theta"] == 500000.0 and we.config_digest(changed) != want


def test_a_config_with_no_canonical_form_has_no_digest():
    assert we.config_digest({"x": float("nan")}) is None
    deep: dict = {}
    cur = deep
    for _ in range(100_000):
        cur["a"] = {}
        cur = cur["a"]
    assert we.config_digest(deep) is None


def test_the_claim_of_an_unquantized_production_plan():
    claim = expected()
    assert claim == {
        "config_digest": we.config_digest(registered()),
        "quantization": "none",
        "weights_check": "verify",
        "unchecked": "refuse",
    }
    assert claim_problem({"hardware": hw(), "memory": mem(), "weights_expected": claim}) is None
    assert expected(tag="# AWQ 4-bit\nAWQ\nbits=4\n")["quantization"] == "awq"
    assert expected(tag="none\n")["quantization"] == "none"
    assert expected(environment="benchmark")["unchecked"] == "start"
    skip = expected(weights_check="skip", skip_reason="weights mirrored by the vendor's loader")
    assert (skip["weights_check"], skip["skip_reason"]) == ("skip", "weights mirrored by the vendor's loader")
    with_layout = we.weights_expected_claim(
        config={}, quantization_txt=None, layout_digest="sha256:" + "ab" * 32, environment="production"
    )
    assert with_layout["layout_digest"] == "sha256:" + "ab" * 32


def hw():
    gpu = lookup("h100-sxm-80gb")
    return hardware_claim(gpu_id=gpu.id, gpu=gpu.as_dict(), count=8, interconnect="nvlink")


def mem():
    return {"gpu_memory_utilization": 0.9, "kv_cache_memory_bytes": None, "weights_bytes_per_gpu": 0, "gpus": 8}


GOOD = {"config_digest": "sha256:" + "0" * 64, "quantization": "none", "weights_check": "verify", "unchecked": "refuse"}


@pytest.mark.parametrize(
    "bad",
    [
        "none",
        [],
        {**GOOD, "config_digest": "0" * 64},
        {**GOOD, "config_digest": "sha256:" + "0" * 63 + "Z"},
        {**GOOD, "quantization": None},
        {**GOOD, "quantization": "AWQ; rm -rf /"},
        {**GOOD, "quantization": "x" * 65},
        {**GOOD, "layout_digest": 7},
        {**GOOD, "layout_digest": "a b"},
        {**GOOD, "weights_check": "maybe"},
        {**GOOD, "weights_check": None},
        {**GOOD, "unchecked": "ignore"},
        {**GOOD, "skip_reason": ["x"]},
        {**GOOD, "skip_reason": "x" * 1001},
        {**GOOD, "tensor_hashes": {}},  # a newer service's check this agent cannot do: refused, not ignored
    ],
)
def test_a_malformed_expectation_is_refused_by_the_node_not_a_crash(tmp_path, bad):
    nc = {"hardware": hw(), "memory": mem(), "weights_expected": bad}
    assert "weights_expected" in (claim_problem(nc) or "")
    smi = str(install_nvidia_smi(tmp_path / "bin", "h100-sxm-8"))
    claims = {"jti": "p", "model_uri": str(tmp_path), "env": {}, "node_checks": nc}
    r = run_checks(claims, nvidia_smi=smi, weights_root=None, verify_hashes=False, say=lambda s: None)
    assert (r.check, r.reason) == ("node checks", "claim_type") and "weights_expected" in r.message


# --- the disk against the claim ----------------------------------------------------------------------------------------


def test_an_awq_tag_on_disk_for_an_unquantized_manifest_names_the_file(tmp_path):
    d = weights_dir(tmp_path / "m", tag="awq")
    found, notes = w.check_expected(d, expected())
    assert [(m.file, m.expected, m.found) for m in found] == [("quantization.txt", "no tag", "tag awq")]
    assert found[0].message() == "quantization.txt: the manifest records no tag, the node has tag awq"
    assert notes == []
    (d / "quantization.txt").write_text("none\n")  # the tag file saying none is none
    assert w.check_expected(d, expected()) == ([], [])
    (d / "quantization.txt").unlink()  # and so is no tag file
    assert w.check_expected(d, expected()) == ([], [])


def test_a_tagged_manifest_and_a_node_without_the_tag(tmp_path):
    d = weights_dir(tmp_path / "m", model=AWQ_STYLE)
    found, _ = w.check_expected(d, expected(AWQ_STYLE, tag="fp8\n"))
    assert [(m.file, m.expected, m.found) for m in found] == [("quantization.txt", "tag fp8", "tag none")]
    (d / "quantization.txt").write_text("FP8\n")
    assert w.check_expected(d, expected(AWQ_STYLE, tag="fp8\n")) == ([], [])


def test_a_config_from_another_model_names_config_json_and_both_digests(tmp_path):
    d = weights_dir(tmp_path / "m", model="meta-llama__Meta-Llama-3.1-70B")
    found, _ = w.check_expected(d, expected())
    [m] = found
    assert (m.file, m.expected) == ("config.json", f"config digest {we.config_digest(registered())}")
    assert m.found == f"config digest {we.config_digest(registered('meta-llama__Meta-Llama-3.1-70B'))}"


@pytest.mark.parametrize(
    "content,found",
    [
        (b"{not json", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (b'{"rope_theta": NaN}', "JSON with no canonical form (NaN, Infinity or too deep)"),
        (b"[" * 200_000 + b"]" * 200_000, "not JSON (maximum recursion depth exceeded while decoding a JSON array"),
    ],
    ids=["not-json", "nan", "deep"],
)
def test_a_config_that_is_not_one_is_a_mismatch(tmp_path, content, found):
    d = weights_dir(tmp_path / "m")
    (d / "config.json").write_bytes(content)
    [m] = w.check_expected(d, expected())[0]
    assert m.file == "config.json" and m.found.startswith(found)


def test_huge_fifo_and_escaping_files_are_mismatches_naming_the_file_without_reading_them(tmp_path):
    d = weights_dir(tmp_path / "m")
    with open(d / "quantization.txt", "wb") as fh:  # sparse: 1 GiB that is never read
        fh.truncate(1 << 30)
    os.mkfifo(tmp_path / "pipe")
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(tmp_path / "pipe")  # a FIFO outside the directory, through a link
    found = {m.file: m.found for m in w.check_expected(d, expected())[0]}
    assert found["quantization.txt"] == (
        f"an unreadable tag ({1 << 30} bytes, more than the {w.MAX_TAG} this file may have)"
    )
    assert found["config.json"].startswith(f"a symlink to {tmp_path / 'pipe'}, outside the weights directory")
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")  # a FIFO inside: not a regular file, never opened for reading
    assert {m.file: m.found for m in w.check_expected(d, expected())[0]}["config.json"] == "not a regular file"


@pytest.mark.parametrize("kind", ["loop", "dangling", "directory"])
def test_odd_config_and_tag_files(tmp_path, kind):
    d = weights_dir(tmp_path / "m", tag="none")
    odd(d, "quantization.txt", kind)
    found = {m.file: m.found for m in w.check_expected(d, expected())[0]}
    assert found == {
        "quantization.txt": "an unreadable tag ("
        + {
            "loop": "a symlink loop",
            "dangling": "a dangling symlink (its target does not exist)",
            "directory": "a directory where a file is expected",
        }[kind]
        + ")"
    }


def test_no_weights_directory_is_one_mismatch(tmp_path):
    found, _ = w.check_expected(tmp_path / "absent", expected())
    assert [(m.file, m.found) for m in found] == [(str(tmp_path / "absent"), "no such directory")]


# --- the layout digest, through the reader hook -------------------------------------------------------------------------


LAYOUT = "sha256:" + "1f" * 32


def with_layout(digest=LAYOUT) -> dict:
    return {**expected(), "layout_digest": digest}


def test_the_layout_digest_is_compared_when_the_reader_reads_the_headers(tmp_path):
    d = weights_dir(tmp_path / "m")
    seen: list[pathlib.Path] = []

    def reader(directory: pathlib.Path) -> str | None:
        seen.append(directory)
        return LAYOUT

    assert w.check_expected(d, with_layout(), layout_reader=reader) == ([], []) and seen == [d]
    found, _ = w.check_expected(d, with_layout("sha256:" + "2e" * 32), layout_reader=reader)
    assert [(m.file, m.expected, m.found) for m in found] == [
        ("safetensors headers", f"layout digest sha256:{'2e' * 32}", f"layout digest {LAYOUT}")
    ]


def test_unreadable_headers_name_the_file_and_no_checkpoint_is_refused(tmp_path):
    d = weights_dir(tmp_path / "m")

    def hostile(directory):
        raise w.LayoutUnreadable("model-00002-of-00004.safetensors", "header length 2^60 bytes, more than 100 MB")

    found, _ = w.check_expected(d, with_layout(), layout_reader=hostile)
    assert [(m.file, m.found) for m in found] == [
        ("model-00002-of-00004.safetensors", "headers that cannot be read (header length 2^60 bytes, more than 100 MB)")
    ]
    # no safetensors checkpoint where the manifest's has one: refused, never passed
    found, _ = w.check_expected(d, with_layout())
    assert [(m.file, m.found) for m in found] == [("safetensors headers", "no safetensors checkpoint")]
    # a plan without a layout digest never asks the reader
    assert w.check_expected(d, expected(), layout_reader=hostile) == ([], [])


# --- the boot check: nothing to compare ------------------------------------------------------------------------------


def boot(tmp_path, nc_weights: dict | None, uri: str, weights_root=None, **record):
    smi = str(install_nvidia_smi(tmp_path / "bin", "h100-sxm-8"))
    nc = {"hardware": hw(), "memory": mem(), **({"weights_expected": nc_weights} if nc_weights else {}), **record}
    lines: list[str] = []
    r = run_checks(
        {"jti": "p", "model_uri": uri, "env": {}, "node_checks": nc},
        nvidia_smi=smi,
        weights_root=weights_root,
        verify_hashes=False,
        say=lines.append,
    )
    return r, lines


def test_a_remote_uri_without_a_mapping_refuses_a_production_plan(tmp_path):
    r, _ = boot(tmp_path, expected(), "s3://weights/llama-3.1-8b")
    assert (r.check, r.reason, r.details) == (
        "weights",
        "weights_unverifiable",
        {"model_uri": "s3://weights/llama-3.1-8b"},
    )
    assert r.message.startswith(
        "s3://weights/llama-3.1-8b is remote and no --weights-root maps it to a local directory: a production plan "
        "does not start on weights nobody compared"
    )


def test_a_benchmark_plan_a_skip_and_an_old_plan_start_saying_so(tmp_path):
    r, lines = boot(tmp_path, expected(environment="benchmark"), "s3://weights/llama-3.1-8b")
    assert (
        r is None
        and (
            "weights: s3://weights/llama-3.1-8b is remote and no --weights-root maps it to a local directory: not "
            "checked (a benchmark plan)"
        )
        in lines
    )
    skip = expected(weights_check="skip", skip_reason="loaded through the vendor's \x1b[2Jmirror")
    d = weights_dir(tmp_path / "m", tag="awq")  # skipped: not even a local mismatch is looked at
    r, lines = boot(tmp_path, skip, str(d))
    assert r is None and any(
        "weights: NOT CHECKED: the plan was signed with weights_check skip" in x and "\\x1b[2J" in x for x in lines
    )
    r, lines = boot(tmp_path, None, "s3://weights/llama-3.1-8b")
    assert r is None and any("signed before plans carried one): not checked" in x for x in lines)


def test_a_mapped_remote_uri_is_compared_and_the_record_adds_its_other_files(tmp_path):
    root = tmp_path / "root"
    d = weights_dir(root / "weights" / "llama-3.1-8b", tag="awq")
    record = w.describe(d)
    record["quantization"] = None  # the manifest said unquantized; the record's line for the tag is the same file
    r, _ = boot(tmp_path, expected(), "s3://weights/llama-3.1-8b", root, weights=record)
    assert (r.reason, [m["file"] for m in r.details["mismatches"]]) == ("weights_mismatch", ["quantization.txt"])
    (d / "quantization.txt").unlink()
    os.truncate(d / "model-00003-of-00004.safetensors", 10)
    r, _ = boot(tmp_path, expected(), "s3://weights/llama-3.1-8b", root, weights=record)
    assert r.details["mismatches"] == [
        {"file": "model-00003-of-00004.safetensors", "expected": "4096 bytes", "found": "10 bytes"}
    ]
    os.truncate(d / "model-00003-of-00004.safetensors", 4096)
    r, lines = boot(tmp_path, expected(), "s3://weights/llama-3.1-8b", root, weights=record)
    assert r is None and f"weights: {d} matches the manifest (4 shards)" in lines
    r, lines = boot(tmp_path, expected(), "s3://weights/llama-3.1-8b", root)
    assert r is None and f"weights: {d} matches the manifest (config and tag)" in lines


def test_the_agent_reads_the_layout_from_real_safetensors_headers(tmp_path):
    """The reader the agent runs (tensor_readers.directory_layout) on real files: the digest the manifest recorded
    passes, a re-saved checkpoint with one tensor of another shape is refused naming the headers, a hostile header
    names its file."""
    from service.tensor_readers import directory_layout, read_directory
    from tests.support.safetensors_files import st_bytes

    d = weights_dir(tmp_path / "m")
    for f in d.glob("*.safetensors"):
        f.unlink()
    (d / "model.safetensors.index.json").unlink(missing_ok=True)
    (d / "model.safetensors").write_bytes(st_bytes({"a.weight": ("F32", [4, 8]), "b.weight": ("F32", [8])}))
    digest = read_directory(d).layout_digest
    assert w.check_expected(d, with_layout(digest), layout_reader=directory_layout)[0] == []
    (d / "model.safetensors").write_bytes(st_bytes({"a.weight": ("F32", [4, 4]), "b.weight": ("F32", [8])}))
    found, _ = w.check_expected(d, with_layout(digest), layout_reader=directory_layout)
    assert [m.file for m in found] == ["safetensors headers"] and found[0].expected == f"layout digest {digest}"
    (d / "model.safetensors").write_bytes((2**60).to_bytes(8, "little") + b"{}")
    found, _ = w.check_expected(d, with_layout(digest), layout_reader=directory_layout)
    assert [m.file for m in found] == ["model.safetensors"]
