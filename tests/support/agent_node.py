"""A node for the end-to-end agent tests: a stand-in ``vllm`` that logs its argv and prints what vLLM prints, a
replayed nvidia-smi, and the agent CLI run against a live service."""

from __future__ import annotations

import os
import pathlib
import subprocess
import textwrap

import httpx

from tests.support.gpus import install_nvidia_smi, weights_dir
from tests.support.live import PREFLIGHT, PY

FAKE_VLLM = textwrap.dedent("""\
    #!{py}
    import os, pathlib, signal, sys, time
    log = pathlib.Path(os.environ["FAKE_VLLM_LOG"])
    with log.open("a") as fh:
        fh.write(" ".join(sys.argv[1:]) + "\\n")
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print("INFO gpu_worker.py Available KV cache memory: 61.23 GiB", flush=True)
    print("INFO kv_cache_utils.py GPU KV cache size: 501,568 tokens", flush=True)
    print("INFO kv_cache_utils.py Maximum concurrency for 8,192 tokens per request: 61.23x", flush=True)
    print("INFO gpu_worker.py The current --gpu-memory-utilization=0.9000 is equivalent to "
          "--kv-cache-memory-bytes=65745289216 without CUDA graph memory profiling. To maintain the same effective "
          "KV cache size before increasing --gpu-memory-utilization, explicitly set "
          "--kv-cache-memory-bytes=65745289000.", flush=True)
    marker = log.with_suffix(".crashed")
    if mode == "crash-once" and not marker.exists():
        marker.write_text("1")
        print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(1)
    print("INFO:     Application startup complete.", flush=True)
    if mode == "serve":
        signal.signal(signal.SIGTERM, lambda *a: (print("INFO: shutting down", flush=True), sys.exit(0)))
        while True:
            time.sleep(0.1)
    print("served and exited", flush=True)
""")


# The weights the end-to-end manifests point at (setup_fleet's s3://llama-8b, the group tests' s3://dsv3), as a node
# holds them under its --weights-root: the fixture's config.json, no quantization.txt — what the manifests registered.
WEIGHTS = {"llama-8b": "meta-llama__Meta-Llama-3.1-8B", "dsv3": "deepseek-ai__DeepSeek-V3"}


def weights_root(dest):
    """A node's --weights-root holding WEIGHTS (a production plan is refused by a node that cannot compare them)."""
    for bucket, model in WEIGHTS.items():
        weights_dir(dest / bucket, model, shards=1)
    return dest


class Node:
    """One node: its token, trust file, state file, a stand-in vllm and a log of the argv each launch got."""

    weights: pathlib.Path | None = None  # its --weights-root (None: the agent runs without one)

    def __init__(self, tmp_path, url, token, name="gpu-01", gpus="h100-sxm-8"):
        self.url, self.token, self.name = url, token, name
        self.dir = tmp_path / f"node-{name}"
        (self.dir / "bin").mkdir(parents=True)
        fake = self.dir / "bin" / "vllm"
        fake.write_text(FAKE_VLLM.format(py=PY))
        fake.chmod(0o755)
        install_nvidia_smi(self.dir / "bin", gpus)  # replayed nvidia-smi: the hardware the node is registered with
        self.log = self.dir / "vllm.log"
        self.state = self.dir / "state.json"
        self.trust = self.dir / "trust.json"
        self.trust.write_text(httpx.get(f"{url}/.well-known/jwks.json").text)  # provisioning
        self.weights = weights_root(self.dir / "weights")

    def launches(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def env(self, **extra):
        return {
            **os.environ,
            "PATH": f"{self.dir / 'bin'}:{os.environ['PATH']}",
            "FAKE_VLLM_LOG": str(self.log),
            "PREFLIGHT_DATA_DIR": str(self.dir / "var"),
            **extra,
        }

    def args(self, url=None, *more):
        return [
            PREFLIGHT,
            "agent",
            "run",
            "--server",
            url or self.url,
            "--node",
            self.name,
            "--token",
            self.token,
            "--state",
            str(self.state),
            "--trust",
            str(self.trust),
            "--exec",
            *(["--weights-root", str(self.weights)] if self.weights is not None else []),
            *more,
        ]

    def run(self, *more, url=None, timeout=60, **env):
        return subprocess.run(
            self.args(url, *more), env=self.env(**env), capture_output=True, text=True, timeout=timeout
        )
