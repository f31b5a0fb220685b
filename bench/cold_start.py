"""Cold start of the offline check: the CPU one `preflight check` process spends on one file, and on 50 files in one
call (a pre-commit hook over a deploy repository), beside a bare interpreter.

    python -m bench.cold_start [--runs 15] [--python PATH] [--cwd DIR]

Real input: tests/fixtures/models/meta-llama__Meta-Llama-3.1-70B/config.json inlined into a launch request on
8 × H100 SXM (the request bench.inprocess times); and 50 deploy files of every kind the check reads (copies of the
corpus tests/fixtures/deploy: compose, Kubernetes, LeaderWorkerSet, KServe, Helm values, shell scripts, a
Dockerfile, vLLM config YAML), their models given with ``--models`` as tests/sources/test_check_corpus.py gives
them. Each figure is user + system CPU of the child process (os.wait4), the median of ``--runs`` runs; CPU, not
wall time, so a busy machine changes it less (the wall time is printed beside it). ``--python`` and ``--cwd`` run
another checkout's interpreter and tree (e.g. the commit before, side by side in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from .common import ENGINE_ARGS, FIXTURE, ROOT, machine, table

FLOOR_ONE_FILE = 0.3  # s of CPU for one file
FLOOR_FIFTY_FILES = 3.0  # s of CPU for 50 files in one call


def request_file(directory: pathlib.Path, i: int, root: pathlib.Path) -> pathlib.Path:
    config = json.loads((root / "tests" / "fixtures" / "models" / FIXTURE / "config.json").read_text())
    body = {
        "model": {"name": "meta-llama/Llama-3.1-70B", "config": config},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 8, "nodes": 1, "interconnect": "nvlink"},
        "environment": "production",
        "engine_args": {**ENGINE_ARGS, "max_num_seqs": 64 + i},
    }
    path = directory / f"launch-{i:02d}.json"
    path.write_text(json.dumps(body))
    return path


def script_file(directory: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
    """The same launch as a shell script (the deploy-file path: the shell reader and the argv parse)."""
    model = root / "tests" / "fixtures" / "models" / FIXTURE
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in ENGINE_ARGS.items())
    path = directory / "serve.sh"
    path.write_text(f'#!/bin/sh\nMODEL="{model}"\nexec vllm serve "$MODEL" \\\n  {flags}\n')
    return path


FIFTY = 50


def deploy_files(directory: pathlib.Path, root: pathlib.Path) -> list[str]:
    """``FIFTY`` deploy files of mixed kinds, copies of the corpus in turn, and the ``--gpu`` / ``--gpus`` /
    ``--models`` that check them (one H100 node of 8 for the files that name no GPU)."""
    deploy = root / "tests" / "fixtures" / "deploy"
    expected = json.loads((deploy / "EXPECTED.json").read_text())
    corpus = sorted(p for p in deploy.iterdir() if p.name != "EXPECTED.json" and not p.name.startswith("cmd-"))
    files = []
    for i in range(FIFTY):
        src = corpus[i % len(corpus)]
        dst = directory / f"{i:02d}-{src.name}"
        shutil.copyfile(src, dst)
        files.append(str(dst))
    models = {
        f"{launch['model']}={root / 'tests' / 'fixtures' / 'models' / launch['model_fixture']}"
        for launches in expected.values()
        for launch in launches
        if launch["model_fixture"]
    }
    return ["--gpu", "h100-sxm-80gb", "--gpus", "8", *(a for m in sorted(models) for a in ("--models", m)), *files]


def cpu_of(argv: list[str], cwd: pathlib.Path, codes: tuple[int, ...] = (0, 1)) -> tuple[float, float]:
    """User + system CPU seconds and wall seconds of one run of ``argv`` (its exit status is not judged beyond
    ``codes``: a warn exits 0, a reject 1, a file that cannot be checked 2)."""
    # the warm-up run writes the .pyc files a user's second run reads, even where PYTHONDONTWRITEBYTECODE is set
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in codes:
        raise SystemExit(f"{' '.join(argv[:4])} … exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def median_cpu(argv: list[str], cwd: pathlib.Path, runs: int, codes: tuple[int, ...] = (0, 1)) -> tuple[float, float]:
    """The median CPU and the median wall seconds of ``runs`` runs, after a warm-up run."""
    cpu_of(argv, cwd, codes)  # warm the page cache and the .pyc files
    got = [cpu_of(argv, cwd, codes) for _ in range(runs)]
    return statistics.median(c for c, _ in got), statistics.median(w for _, w in got)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the checkout to measure")
    ap.add_argument("--cwd", default=str(ROOT), help="the checkout to measure (its tests/fixtures are read)")
    args = ap.parse_args(argv)
    cwd = pathlib.Path(args.cwd)
    with tempfile.TemporaryDirectory(prefix="preflight-bench-check-") as tmp:
        files = [str(request_file(pathlib.Path(tmp), i, cwd)) for i in range(50)]
        check = [args.python, "-m", "service.cli", "check"]
        figures = {
            "python -c pass": median_cpu([args.python, "-c", "pass"], cwd, args.runs),
            "check, 1 file": median_cpu([*check, files[0]], cwd, args.runs),
            "check, 50 files": median_cpu([*check, *files], cwd, max(3, args.runs // 3)),
            "check, 1 shell script": median_cpu(
                [*check, "--gpu", "h100-sxm-80gb", "--gpus", "8", str(script_file(pathlib.Path(tmp), cwd))],
                cwd,
                args.runs,
            ),
        }
        deploy = pathlib.Path(tmp) / "deploy"
        deploy.mkdir()
        figures[f"check, {FIFTY} deploy files (mixed kinds)"] = median_cpu(
            [*check, *deploy_files(deploy, cwd)], cwd, max(3, args.runs // 3), codes=(0, 1, 2)
        )
    print(f"preflight check, per process (median) — {machine()}; {cwd}")
    print(table(["command", "CPU s", "wall s"], [[k, c, w] for k, (c, w) in figures.items()]))
    one, fifty = figures["check, 1 file"][0], figures["check, 50 files"][0]
    mixed = figures[f"check, {FIFTY} deploy files (mixed kinds)"][0]
    print(
        f"one file ≤ {FLOOR_ONE_FILE} s: {'met' if one <= FLOOR_ONE_FILE else 'MISSED'}; "
        f"50 files ≤ {FLOOR_FIFTY_FILES} s: {'met' if fifty <= FLOOR_FIFTY_FILES else 'MISSED'}; "
        f"50 deploy files ≤ {FLOOR_FIFTY_FILES} s: {'met' if mixed <= FLOOR_FIFTY_FILES else 'MISSED'}"
    )
    return figures


if __name__ == "__main__":
    main()
