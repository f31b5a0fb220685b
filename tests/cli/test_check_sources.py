"""``preflight check`` over launches where they live (service/cli/check_sources.py, service/sources/): one launch
given as a request, a command line, a shell script, a Dockerfile, a vLLM config, a compose service and a Kubernetes
Deployment gives one verdict and one command; findings are placed at the word they concern; hostile files are refused naming the file."""

from __future__ import annotations

import json
import pathlib
import shlex

import pytest

from service.cli.check_files import run_check
from service.cli.check_sources import parse_options
from tests.support import MODELS, model_config

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "deploy"
SCHEMA = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sarif" / "sarif-schema-2.1.0.json"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MODELS_OPT = ["--models", f"{LLAMA}={MODELS / 'meta-llama__Llama-3.1-8B-Instruct'}"]
HW = ["--gpu", "NVIDIA H100 80GB HBM3", "--gpus", "2"]


def check(*args: str) -> tuple[int, list[str]]:
    out: list[str] = []
    code = run_check(parse_options([*HW, *MODELS_OPT, *args]), out.append)
    return code, out


def json_reports(*args: str) -> tuple[int, list[dict]]:
    code, out = check("--format", "json", *args)
    return code, [json.loads(line) for line in out]


def test_one_launch_in_every_form_gives_one_verdict_and_one_command(tmp_path):
    request = {
        "model": {"name": LLAMA, "uri": LLAMA, "config": model_config("meta-llama__Llama-3.1-8B-Instruct")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 2, "nodes": 1},
        "environment": "production",
        "engine_args": {
            "tensor_parallel_size": 2,
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.85,
            "port": 8000,
        },
    }
    req = tmp_path / "launch.json"
    req.write_text(json.dumps(request))
    code, out = check("--json", str(req))
    expected = json.loads(out[0])
    assert code in (0, 1) and expected["command"].startswith(f"vllm serve {LLAMA} --tensor-parallel-size 2")
    argv = shlex.split((DEPLOY / "cmd-llama.txt").read_text())
    for source in (
        ["--", *argv],
        [str(DEPLOY / "sh-serve-llama.sh")],
        [str(DEPLOY / "docker-vllm-openai.Dockerfile")],
        [str(DEPLOY / "vllm-config-llama.yaml")],
        [str(DEPLOY / "compose-llama-same-launch.yaml")],
        [str(DEPLOY / "k8s-deployment-llama-same-launch.yaml")],
    ):
        got_code, reports = json_reports(*source)
        assert len(reports) == 1, source
        got = reports[0]
        assert (got_code, got["verdict"], got["argv"]) == (code, expected["verdict"], expected["argv"]), source
        # the script and the image also set VLLM_LOGGING_LEVEL=INFO, which the command carries in front
        assert got["command"].endswith(expected["command"]), source
        assert [f["rule"] for f in got["findings"]] == [f["rule"] for f in expected["findings"]], source


def test_findings_are_placed_at_the_word(tmp_path):
    code, reports = json_reports(str(DEPLOY / "sh-bad-tp.sh"))
    assert code == 1
    (r,) = reports
    assert (r["kind"], r["line"], r["col"], r["verdict"]) == ("shell", 5, 1, "reject")
    tp = [f for f in r["findings"] if f["rule"] == "tp_heads_divisible"]
    # --tensor-parallel-size is on line 7, column 3 of the script (its value comes from $TP, set on line 4)
    assert (tp[0]["file"], tp[0]["line"], tp[0]["col"]) == (str(DEPLOY / "sh-bad-tp.sh"), 7, 3)


def test_human_lines_are_path_line_col():
    code, out = check(str(DEPLOY / "sh-bad-tp.sh"))
    path = DEPLOY / "sh-bad-tp.sh"
    assert code == 1 and out[0] == f"== {path}:5:1 (shell): REJECT"
    assert any(line.startswith(f"{path}:7:3: error tp_heads_divisible: ") for line in out)


def test_config_values_are_placed_at_their_yaml_key(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"model: {LLAMA}\nmax-model-len: 8192\ntensor-parallel-size: 3\n")
    code, reports = json_reports(str(cfg))
    tp = next(f for f in reports[0]["findings"] if f["rule"] == "tp_heads_divisible")
    assert code == 1 and (tp["line"], tp["col"]) == (3, 1)


def test_script_referencing_a_config_file(tmp_path):
    (tmp_path / "serve.yaml").write_text("max-model-len: 8192\ntensor-parallel-size: 3\n")
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\nvllm serve {LLAMA} --config serve.yaml\n")
    code, reports = json_reports(str(script))
    tp = next(f for f in reports[0]["findings"] if f["rule"] == "tp_heads_divisible")
    assert code == 1 and (tp["file"], tp["line"], tp["col"]) == (str(tmp_path / "serve.yaml"), 2, 1)


def test_an_unset_variable_is_a_located_problem_not_a_guess(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nexec vllm serve $MODEL_PATH --max-model-len 8192\n")
    code, reports = json_reports(str(script))
    (f,) = reports[0]["findings"]
    assert code == 2 and reports[0]["verdict"] == "invalid"
    assert (f["rule"], f["line"], f["col"]) == ("source_unreadable", 2, 17)
    assert "$MODEL_PATH is not set in the script" in f["message"]


def test_an_argv_vllm_refuses_is_placed_at_the_word():
    code, reports = json_reports("--", "vllm", "serve", LLAMA, "--max-modle-len", "8192")
    (f,) = reports[0]["findings"]
    assert code == 1 and reports[0]["verdict"] == "reject"
    assert (f["file"], f["line"], f["col"]) == ("<command-line>", 1, len(f"vllm serve {LLAMA} ") + 1)
    assert "did you mean --max-model-len" in f["message"]


def test_unresolvable_model_and_gpu_exit_2():
    code, out = run_check_plain(["--gpu", "h100-sxm-80gb", "--gpus", "1", "--", "vllm", "serve", "org/missing"])
    assert code == 2 and "model_unresolved" in out[1] and "org/missing" in out[1]
    code, out = run_check_plain([*MODELS_OPT, "--", "vllm", "serve", LLAMA])
    assert code == 2 and "hardware_unresolved" in out[1] and "--gpu" in out[1]


def run_check_plain(args: list[str]) -> tuple[int, list[str]]:
    out: list[str] = []
    return run_check(parse_options(args), out.append), out


def test_sarif_validates_against_the_sarif_2_1_0_schema():
    import jsonschema_rs

    code, out = check("--format", "sarif", str(DEPLOY / "sh-bad-tp.sh"), "--", "vllm", "serve", LLAMA, "-tp", "3")
    doc = json.loads("\n".join(out))
    jsonschema_rs.validate(json.loads(SCHEMA.read_text()), doc)
    results = doc["runs"][0]["results"]
    placed = [r for r in results if r["ruleId"] == "tp_heads_divisible" and "locations" in r]
    assert placed[0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 7, "startColumn": 3}
    assert code == 1 and any("locations" not in r for r in results)  # the command line has no file


def test_github_annotations_escape_as_github_documents():
    code, out = check("--format", "github", str(DEPLOY / "sh-bad-tp.sh"))
    path = DEPLOY / "sh-bad-tp.sh"
    line = next(x for x in out if "title=tp_kv_heads" in x)
    assert line.startswith(f"::error file={path},line=7,col=3,title=tp_kv_heads::")
    assert "%25" in line and "\n" not in line  # "8 % 3 = 2" with its % escaped


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("binary.sh", b"#!/bin/sh\n\x00\x01\x02" * 100, "binary file"),
        ("huge.sh", b"#" * (10 * 2**20), "larger than"),
        ("latin1.sh", b"#!/bin/sh\nvllm serve caf\xe9\n", "not UTF-8"),
        ("deep.sh", b'vllm serve "' + b"$(" * 200_000, "never closed"),
        ("nested.sh", b"vllm serve " + b"${A:-" * 5_000 + b"x" + b"}" * 5_000, "nested deeper"),
        ("words.sh", b"vllm serve ${A:-" + b"x " * 5_000 + b"}", "more than 4096"),
        ("unknown.txt", b"hello\n", "no kind"),
    ],
)
def test_hostile_files_are_refused_naming_the_file(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    code, out = run_check_plain([*HW, str(path)])
    assert code == 2 and str(path) in out[1] and reason in out[1]


def test_plain_command_line_runs_the_same(tmp_path):
    import subprocess
    import sys

    args = [*HW, *MODELS_OPT, "--format", "json", str(DEPLOY / "sh-bad-tp.sh")]
    plain = subprocess.run(
        [sys.executable, "-m", "service.cli", "check", *args], capture_output=True, text=True, timeout=120
    )
    code, out = check("--format", "json", str(DEPLOY / "sh-bad-tp.sh"))
    assert (plain.returncode, plain.stdout.splitlines()) == (code, out)


@pytest.mark.parametrize(
    ("name", "template"),
    [
        (
            "compose.yaml",
            "services:\n  vllm:\n    image: vllm/vllm-openai:latest\n"
            "    environment: {{HF_ENDPOINT: '{endpoint}', HF_TOKEN: file-token}}\n"
            "    command: [org/tiny, --max-model-len, '8192']\n",
        ),
        (
            "pod.yaml",
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - name: vllm\n"
            "      image: vllm/vllm-openai:latest\n"
            "      env: [{{name: HF_ENDPOINT, value: '{endpoint}'}}]\n"
            "      args: [org/tiny, --max-model-len, '8192']\n",
        ),
        ("run.sh", "#!/bin/sh\nexport HF_ENDPOINT={endpoint}\nvllm serve org/tiny --max-model-len 8192\n"),
    ],
)
def test_the_model_is_looked_for_with_the_checkers_environment_never_the_files(tmp_path, monkeypatch, name, template):
    """A deploy file that sets HF_ENDPOINT must not receive the HF_TOKEN of whoever runs the check: the Hub asked is
    the checker's own (its HF_ENDPOINT, its token), whatever the file's HF_* say (they describe the node)."""
    from tests.support.hub import serve

    config = (MODELS / "meta-llama__Llama-3.1-8B-Instruct" / "config.json").read_bytes()
    with serve({"config.json": config}) as (own, own_url), serve({"config.json": config}) as (theirs, their_url):
        monkeypatch.setenv("HF_ENDPOINT", own_url)
        monkeypatch.setenv("HF_TOKEN", "the-checkers-token")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        path = tmp_path / name
        path.write_text(template.format(endpoint=their_url))
        code, reports = json_reports(str(path))
        assert theirs.requested == []
        assert "/org/tiny/resolve/main/config.json" in own.requested
        assert code in (0, 1) and reports[0]["verdict"] in ("accept", "warn", "reject"), reports


def test_a_yaml_file_without_a_launch_is_skipped_not_failed(tmp_path):
    """The pre-commit hook hands over every YAML file: a CI workflow holds no launch and does not fail the check."""
    workflow = tmp_path / "ci.yml"
    workflow.write_text("name: ci\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps: []\n")
    code, reports = json_reports(str(workflow), str(DEPLOY / "sh-serve-llama.sh"))
    assert [r["verdict"] for r in reports][0] == "skipped" and reports[0]["findings"][0]["severity"] == "info"
    assert code == 0 and reports[1]["verdict"] in ("accept", "warn")


def test_files_that_cannot_hold_a_launch_are_skipped(tmp_path):
    """A pre-commit hook or a ``deploy/*`` glob hands over every YAML and JSON file: one that names no vLLM (a CI
    workflow, mkdocs.yml with a Python tag) or a JSON object that is no launch request is skipped, not an error."""
    mkdocs = tmp_path / "mkdocs.yml"
    mkdocs.write_text("site_name: x\nextra: !!python/name:material.extensions.emoji.twemoji\n")
    dashboard = tmp_path / "dashboard.json"
    dashboard.write_text('{"panels": []}')
    code, reports = json_reports(str(mkdocs), str(dashboard))
    assert code == 0 and [r["verdict"] for r in reports] == ["skipped", "skipped"]


def test_an_unknown_gpu_cannot_be_checked():
    code, reports = json_reports("--gpu", "no-such-gpu", "--gpus", "4", "--", "vllm", "serve", LLAMA)
    assert code == 2 and reports[0]["verdict"] == "invalid" and reports[0]["findings"][0]["rule"] == "gpu_unknown"


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "serve.sh"
    os.mkfifo(fifo)
    code, reports = json_reports(*HW, str(fifo))
    assert code == 2 and "is not a regular file" in reports[0]["findings"][0]["message"]


def test_a_server_behind_a_wrapper_fails_closed(tmp_path):
    """A script that names vLLM's server but yields no launch the reader can follow is an error, never skipped."""
    script = tmp_path / "serve.sh"
    script.write_text(f'#!/bin/bash\nset -e\neval "vllm serve {LLAMA} -tp 3"\n')
    code, reports = json_reports(*HW, str(script))
    (f,) = reports[0]["findings"]
    assert code == 2 and reports[0]["verdict"] == "invalid" and (f["rule"], f["line"]) == ("source_unreadable", 3)


def test_a_vllm_config_with_mistyped_keys_is_read_and_refused_at_the_key(tmp_path):
    """A .yaml with a top-level model: key that is no other kind is vLLM's config, however many keys are mistyped:
    never skipped."""
    config = tmp_path / "serve.yaml"
    config.write_text(f"model: {LLAMA}\ntensor-paralel-size: 4\nmax-modl-len: 4096\n")
    code, reports = json_reports(str(config))
    (r,) = reports
    (f,) = r["findings"]
    assert (code, r["kind"], r["verdict"]) == (1, "vllm-config", "reject")
    assert (f["rule"], f["line"], f["col"]) == ("argv_unreadable", 2, 1)
    assert f["message"].startswith("--tensor-paralel-size is not an option of vLLM")


def test_an_empty_model_and_a_control_character_are_located(tmp_path):
    code, reports = json_reports("--", "vllm", "serve", "--model=", "-tp", "2")
    (f,) = reports[0]["findings"]
    assert (code, f["col"], f["message"]) == (1, 12, "the model is empty: name it as `vllm serve MODEL`")
    code, reports = json_reports("--", "vllm", "serve", LLAMA, "--served-model-name", "llama\a")
    (f,) = reports[0]["findings"]
    assert f["message"] == (
        "argument --served-model-name: served_model_name holds a control character ('\\x07'): 'llama\\x07'"
    )


def test_launches_per_file_are_bounded_at_the_first_over(tmp_path):
    """A script of 300 background launches or a Kubernetes List of 300 Pods is no deploy file: refused at the 257th
    launch, before any is validated."""
    from service.sources.found import MAX_LAUNCHES

    script = tmp_path / "many.sh"
    script.write_text("#!/bin/sh\n" + f"vllm serve {LLAMA} -tp 2 &\n" * 300)
    pods = tmp_path / "pods.yaml"
    pod = "- apiVersion: v1\n  kind: Pod\n  spec:\n    containers:\n    - name: vllm\n      image: vllm/vllm-openai:latest\n"
    pods.write_text("apiVersion: v1\nkind: List\nitems:\n" + pod * 300)
    code, reports = json_reports(str(script), str(pods))
    assert code == 2 and len(reports) == 2
    (s,), (k,) = reports[0]["findings"], reports[1]["findings"]
    assert (s["line"], s["message"]) == (
        MAX_LAUNCHES + 2,
        f"{script} holds more than 256 launches: not a deploy file (split it)",
    )
    assert (k["line"], k["col"]) == (3 + 6 * MAX_LAUNCHES + 5, 7)  # the 257th container


def test_identical_findings_collapse_to_one_with_a_count(tmp_path):
    script = tmp_path / "ticks.sh"
    script.write_text(f"#!/bin/sh\nvllm serve {LLAMA} " + "``" * 1500 + "\n")
    code, reports = json_reports(str(script))
    (f,) = reports[0]["findings"]
    assert (code, f["line"], f["col"], f["count"]) == (2, 2, 45, 1500)
    assert f["message"].endswith("its output is not known here (1500 times; the first is placed)")


def test_the_human_output_names_the_policy_profile_once():
    from service.domain.policy_profile import default_profile

    code, out = check(str(DEPLOY / "sh-bad-tp.sh"), str(DEPLOY / "vllm-config-llama.yaml"))
    digest = default_profile().digest.partition(":")[2][:12]
    assert out[-1] == f"policy profile: default (shipped, digest {digest}), environment production"
    assert sum(line.startswith("policy profile:") for line in out) == 1
    _, lines = json_reports(str(DEPLOY / "sh-bad-tp.sh"))
    assert lines[0]["policy"]["name"] == "default"  # json carries it per launch, no extra line


def test_a_missing_gpu_count_says_what_applies_to_the_kind(tmp_path):
    script = tmp_path / "serve.sh"
    script.write_text(f"#!/bin/sh\nexec vllm serve {LLAMA} -tp 2\n")
    hw = ["--gpu", "h100-sxm-80gb", *MODELS_OPT]
    messages = {}
    for source in (["--", "vllm", "serve", LLAMA, "-tp", "2"], [str(script)]):
        code, out = run_check_plain([*hw, "--format", "json", *source])
        (f,) = json.loads(out[0])["findings"]
        assert (code, f["rule"]) == (2, "hardware_unresolved")
        messages[source[0]] = f["message"]
    assert messages["--"].endswith("per node; a command line does not say how many GPUs it has)")
    assert messages[str(script)].endswith("per node; a shell script does not say how many GPUs its launch has)")
    assert not any("resources.limits" in m for m in messages.values())


def test_words_after_the_separator_that_are_no_command_are_one_usage_error():
    from service.cli.check_sources import UsageError

    with pytest.raises(UsageError) as err:
        parse_options(["--", LLAMA, "--tensor-parallel-size", "2"])
    assert str(err.value) == (
        "after --, expected a command: vllm serve MODEL … or python -m vllm.entrypoints.openai.api_server … "
        f"('{LLAMA}' is neither a command nor a file)"
    )
    # files after -- stay files (the POSIX end of options), and a wrapped command is a command
    assert parse_options(["--", str(DEPLOY / "sh-bad-tp.sh")]).files == [DEPLOY / "sh-bad-tp.sh"]
    assert parse_options(["--", "sudo", "-E", "vllm", "serve", LLAMA]).command == ["sudo", "-E", "vllm", "serve", LLAMA]


def test_the_command_line_lists_the_options_and_parses_as_the_plain_path():
    from typer.testing import CliRunner

    from service.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    for option in ("--gpu", "--gpus", "--nodes", "--vllm-version", "--models", "--environment", "--policy"):
        assert f"{option} " in shown.output, option
    assert "human|json|sarif|github" in shown.output and "--strict" in shown.output
    args = [*HW, *MODELS_OPT, "--format", "json", "--", "env", "VLLM_LOGGING_LEVEL=INFO", "vllm", "serve", LLAMA]
    typed = runner.invoke(app, ["check", *args])
    code, out = run_check_plain(args)
    assert (typed.exit_code, typed.output.splitlines()) == (code, out)
    usage = runner.invoke(app, ["check", "--", LLAMA, "--tensor-parallel-size", "2"])
    assert usage.exit_code == 2 and "after --, expected a command" in usage.output


def test_a_directory_is_walked_for_deploy_files(tmp_path):
    """``preflight check deploy/``: the deploy files under it (subdirectories too), not READMEs, not .git."""
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "README.md").write_text("# deploy\n")
    (tmp_path / ".git" / "hook.sh").write_text(f"vllm serve {LLAMA} -tp 3\n")
    (tmp_path / "sub" / "serve").write_text(f"#!/bin/sh\nvllm serve {LLAMA} -tp 3\n")
    (tmp_path / "ok.sh").write_text(f"vllm serve {LLAMA} -tp 2\n")
    code, reports = json_reports(*HW, *MODELS_OPT, str(tmp_path))
    assert code == 1
    assert [(pathlib.Path(r["file"]).relative_to(tmp_path).as_posix(), r["verdict"]) for r in reports] == [
        ("ok.sh", "warn"),
        ("sub/serve", "reject"),
    ]
