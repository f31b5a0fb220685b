"""``preflight check`` end to end over the deploy-file corpus (tests/fixtures/deploy, every kind): each file checked
in process through ``run_check`` as a user runs it from the repository's root — ``--gpu`` / ``--gpus`` where
EXPECTED.json's ``hardware.assumed`` says the file does not name them, ``--models NAME=DIR`` for each model's
fixture — gives the verdict, rule and line:col EXPECTED.json holds for each launch."""

from __future__ import annotations

import json
import shlex

import pytest

from service.cli.check_files import run_check
from service.cli.check_sources import parse_options
from tests.sources.expected import DEPLOY, EXPECTED, MODELS, ROOT, corpus

WANT = json.loads(EXPECTED.read_text())


def arguments(name: str) -> list[str]:
    """The command line that checks one corpus file."""
    args = ["--format", "json"]
    for launch in WANT[name]:
        hw = launch["hardware"]
        if "gpu" in hw["assumed"]:
            args += ["--gpu", hw["gpu"]]
        if "count" in hw["assumed"]:
            args += ["--gpus", str(hw["count"])]
        if launch["model_fixture"]:
            args += ["--models", f"{launch['model']}={MODELS / launch['model_fixture']}"]
    path = DEPLOY / name
    if name.startswith("cmd-"):
        return [*args, "--", *shlex.split(path.read_text())]
    return [*args, str(path.relative_to(ROOT))]


def first(findings: list[dict]) -> dict | None:
    """The finding EXPECTED.json names: the first error, else the first warning."""
    for severity in ("error", "warning"):
        found = [f for f in findings if f["severity"] == severity]
        if found:
            return found[0]
    return None


@pytest.mark.parametrize("name", sorted(WANT))
def test_check_gives_the_expected_verdict_rule_and_place(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    want = WANT[name]
    if not want:  # no launch in the file: nothing to check, said as such (a hook hands over every YAML file)
        out: list[str] = []
        code = run_check(parse_options(arguments(name)), out.append)
        (report,) = map(json.loads, out)
        assert (code, report["verdict"], report["findings"][0]["rule"]) == (0, "skipped", "no_launch")
        return
    out = []
    code = run_check(parse_options(arguments(name)), out.append)
    reports = [json.loads(line) for line in out]
    assert len(reports) == len(want)
    for report, launch in zip(reports, want, strict=True):
        f = first(report["findings"])
        got = (report["verdict"], f and f["rule"], f and f["line"], f and f["col"])
        assert got == (launch["verdict"], launch["rule"], launch["line"], launch["col"]), report["findings"]
        assert (report["file"], report["line"], report["col"]) == tuple(launch["at"].rsplit(":", 2)[:1]) + tuple(
            int(x) for x in launch["at"].rsplit(":", 2)[1:]
        )
    worst = {"invalid": 2, "reject": 1}
    assert code == max(worst.get(w["verdict"], 0) for w in want)


def test_every_corpus_file_is_in_expected_json():
    assert sorted(WANT) == sorted(p.name for p in corpus())
    kinds = {p.name.split("-")[0] for p in corpus()}
    assert kinds >= {"cmd", "compose", "docker", "helm", "k8s", "kserve", "lws", "sh", "vllm"}


def test_a_shared_gpu_label_is_resolved_by_the_check_and_given_way_by_gpu(tmp_path, monkeypatch):
    """The file's ``nvidia.com/gpu.product`` label is read as written and judged in one place (resolve.py): a GPU
    shared by time-slicing is refused as hardware the check cannot assume, unless --gpu says what to check on."""
    monkeypatch.chdir(ROOT)
    text = (DEPLOY / "k8s-deployment-tp-over-gpu-limit.yaml").read_text()
    shared = tmp_path / "shared.yaml"
    shared.write_text(text.replace("NVIDIA-L40S", "NVIDIA-L40S-SHARED"))
    models = ["--models", f"Qwen/Qwen2.5-72B-Instruct={MODELS / 'Qwen__Qwen2.5-72B-Instruct'}"]
    out: list[str] = []
    code = run_check(parse_options(["--format", "json", *models, str(shared)]), out.append)
    (report,) = map(json.loads, out)
    assert (code, report["findings"][0]["rule"]) == (2, "hardware_unresolved")
    assert "shared by time-slicing" in report["findings"][0]["message"]
    out = []
    code = run_check(parse_options(["--format", "json", "--gpu", "l40s-48gb", *models, str(shared)]), out.append)
    assert (code, json.loads(out[0])["verdict"]) == (1, "reject")
