"""The shell-script and Dockerfile readers (service/sources/shell.py, dockerfile.py): the argv each launch gets and
the line and column of every word."""

from __future__ import annotations

import pathlib

from service.sources.dockerfile import read_dockerfile
from service.sources.read import read_launches
from service.sources.shell import read_script

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "deploy"


def placed(fl):
    return [(w.text, (w.at.line, w.at.col) if w.at else None) for w in fl.words]


def test_script_expansion_continuations_and_env():
    (fl,) = read_launches(DEPLOY / "sh-serve-llama.sh")
    assert fl.kind == "shell" and (fl.at.line, fl.at.col) == (14, 1)
    assert placed(fl) == [
        ("vllm", (14, 6)),
        ("serve", (14, 11)),
        ("meta-llama/Llama-3.1-8B-Instruct", (14, 17)),
        ("--tensor-parallel-size", (15, 5)),
        ("2", (15, 28)),
        ("--max-model-len", (16, 5)),
        ("8192", (16, 21)),
        ("--gpu-memory-utilization", (17, 5)),
        ("0.85", (17, 30)),
        ("--port", (18, 5)),
        ("8000", (18, 12)),
    ]
    assert fl.env == {"VLLM_LOGGING_LEVEL": "INFO"} and fl.problems == []


def test_several_launches_prefixes_and_field_splitting():
    text = (
        'ARGS="--max-num-seqs 64 --enforce-eager"\n'
        "VLLM_USE_DEEP_GEMM=1 nohup vllm serve org/a $ARGS > a.log 2>&1 &\n"
        "env VLLM_PORT=1 python3 -m vllm.entrypoints.openai.api_server --model org/b\n"
        "sh -c 'vllm serve org/c -tp 2'\n"
        'vllm serve org/d "$@"\n'
    )
    a, b, c, d = read_script(text, "run.sh")
    assert a.argv == ["vllm", "serve", "org/a", "--max-num-seqs", "64", "--enforce-eager"]
    assert [w.at.col for w in a.words[3:]] == [45, 45, 45]  # split words are placed at $ARGS
    assert a.env == {"VLLM_USE_DEEP_GEMM": "1"}
    assert b.argv == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/b"]
    assert c.argv == ["vllm", "serve", "org/c", "-tp", "2"] and (c.words[2].at.line, c.words[2].at.col) == (4, 19)
    assert d.argv == ["vllm", "serve", "org/d"] and d.notes[0][0].col == 19


def test_unknowable_words_are_problems():
    (fl,) = read_script("M=$(cat model)\nvllm serve $M --port $1\n", "run.sh")
    assert [(at.line, at.col, text.split(" ")[0]) for at, text in fl.problems] == [(2, 12, "$M"), (2, 22, "$1")]


def test_dockerfile_exec_form_on_the_vllm_image():
    (fl,) = read_launches(DEPLOY / "docker-vllm-openai.Dockerfile")
    assert fl.argv[:4] == ["vllm", "serve", "--model", "meta-llama/Llama-3.1-8B-Instruct"]
    assert fl.words[0].at is None and (fl.words[2].at.line, fl.words[2].at.col) == (6, 6)
    assert (fl.words[4].at.line, fl.words[4].at.col) == (7, 6)
    assert fl.env == {"HF_HOME": "/models", "VLLM_LOGGING_LEVEL": "INFO"}


def test_dockerfile_entrypoint_and_cmd_combined_and_shell_form():
    text = (
        "FROM python:3.12 AS base\nENV MODEL=org/m\nFROM base\n"
        'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]\nCMD ["--model", "org/x"]\n'
    )
    (fl,) = read_dockerfile(text, "Dockerfile")
    assert fl.argv == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/x"]
    assert fl.env == {"MODEL": "org/m"}
    shell = "FROM base\nENV M=org/y\nCMD vllm serve $M \\\n  -tp 2\n"
    (fl,) = read_dockerfile(shell, "Dockerfile")
    assert placed(fl)[2:] == [("org/y", (3, 16)), ("-tp", (4, 3)), ("2", (4, 7))]


def test_a_dockerfile_without_a_launch():
    assert read_dockerfile('FROM ubuntu\nCMD ["bash"]\n', "Dockerfile") == []


def test_wrapper_commands_are_followed_as_a_shell_runs_them():
    """One-line launch scripts behind the common wrappers: each wrapper's own options are skipped as it reads them,
    and the argv is vLLM's words only, placed where they are written."""
    lines = [
        "uv run --with vllm==0.33.0 --python 3.12 vllm serve org/m -tp 2",
        "sudo -E -u vllm vllm serve org/m -tp 2",
        "timeout --signal=KILL -k 30s 1h vllm serve org/m -tp 2",
        "numactl --cpunodebind=0 --membind 0 vllm serve org/m -tp 2",
        "taskset -c 0-15 vllm serve org/m -tp 2",
        "nice -n 5 stdbuf -oL -eL vllm serve org/m -tp 2",
        "chrt -f 50 vllm serve org/m -tp 2",
        "setsid -f nohup vllm serve org/m -tp 2 > serve.log 2>&1 &",
        "time -p env -u HF_TOKEN vllm serve org/m -tp 2",
        "time { vllm serve org/m -tp 2; }",
        "exec -a vllm-server uv run -- python3 -m vllm.entrypoints.openai.api_server --model org/m -tp 2",
    ]
    for line in lines:
        (fl,) = read_script(f"#!/bin/bash\n{line}\n", "serve.sh")
        assert fl.argv[fl.argv.index("org/m") :] == ["org/m", "-tp", "2"], line
        first = line.index(" vllm serve " if fl.argv[0] == "vllm" else " python3 -m ") + 2
        assert fl.argv[0] in ("vllm", "python3") and fl.problems == [] and fl.words[0].at.col == first, line


def test_wrappers_change_the_environment_as_they_run():
    text = (
        "export VLLM_USE_V1=1 HF_HUB_OFFLINE=1\n"
        "sudo VLLM_LOGGING_LEVEL=DEBUG vllm serve org/a\n"
        "sudo -E vllm serve org/b\n"
        "sudo --preserve-env=HF_HUB_OFFLINE vllm serve org/c\n"
        "env -i VLLM_PORT=9000 vllm serve org/d\n"
        "env -u VLLM_USE_V1 vllm serve org/e\n"
    )
    a, b, c, d, e = read_script(text, "serve.sh")
    assert a.env == {"VLLM_LOGGING_LEVEL": "DEBUG"}  # sudo resets the environment unless -E
    assert b.env == {"VLLM_USE_V1": "1", "HF_HUB_OFFLINE": "1"}
    assert c.env == {"HF_HUB_OFFLINE": "1"}
    assert d.env == {"VLLM_PORT": "9000"} and e.env == {"HF_HUB_OFFLINE": "1"}


def test_wrapper_arguments_not_followed_fail_closed_at_the_word():
    text = (
        "sudo --bogus vllm serve org/a\n"
        "sudo $SUDO_FLAGS vllm serve org/b\n"
        'env -S "vllm serve org/c"\n'
        "uv run -m vllm.entrypoints.openai.api_server --model org/d\n"
        'eval "vllm serve org/e"\n'
        "V=vllm\n"
        "$V serve org/f\n"
        "sudo ls -l\n"
    )
    found = read_script(text, "serve.sh")
    placed_problems = [(p[0].line, p[0].col, p[1].split(":")[0]) for fl in found for p in fl.problems]
    assert placed_problems == [
        (1, 6, "--bogus is not an option of sudo known here (sudo src/parse_args.c"),
        (2, 6, "a word not known here stands where sudo's options or command are"),
        (5, 1, "eval runs its arguments as a new command line"),
        (7, 1, "the program is $V, a command named by a variable"),
    ]


def test_wrapped_server_that_cannot_be_followed_is_a_file_error(tmp_path):
    """``env -S`` and ``uv run -m`` name the server where no launch can be read: the file fails closed, placed."""
    import pytest

    from service.sources.read import SourceError

    for line in ('env -S "vllm serve org/c -tp 2"', "uv run -m vllm.entrypoints.openai.api_server --model org/d"):
        script = tmp_path / "serve.sh"
        script.write_text(f"#!/bin/sh\nset -e\n{line}\n")
        with pytest.raises(SourceError) as err:
            read_launches(script)
        assert err.value.at.line == 3, line


def test_a_kubernetes_manifest_in_flow_style_is_read(tmp_path):
    """``kubectl get -o json`` output saved as .yaml is YAML too: it must be read, not skipped."""
    from service.sources.read import read_launches

    pod = tmp_path / "pod.yaml"
    pod.write_text(
        '{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [{"name": "v", '
        '"image": "vllm/vllm-openai:latest", "args": ["--model", "org/m", "--tensor-parallel-size", "3"], '
        '"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}\n'
    )
    (found,) = read_launches(pod)
    assert found.kind == "kubernetes" and found.gpu_count == 4 and "--tensor-parallel-size" in found.argv


def test_an_exec_form_launch_behind_an_unknown_wrapper_fails_closed(tmp_path):
    """``["uv", "-q", "run", "vllm", "serve", …]``: the server is named as list items; if the readers cannot follow
    the wrapper the file is an error, never skipped. A comment line naming it is not a launch."""
    import pytest

    from service.sources.found import SourceError
    from service.sources.read import read_launches

    pod = tmp_path / "pod.yaml"
    head = "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: v\n"
    pod.write_text(head + '    command: ["uv", "-q", "run", "vllm", "serve", "org/m"]\n')
    with pytest.raises(SourceError) as e:
        read_launches(pod)
    assert e.value.at.line == 7
    pod.write_text(head + "    # vllm serve org/m\n    command: [sleep, '1']\n")
    assert read_launches(pod) == []
