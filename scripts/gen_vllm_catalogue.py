"""Generate Preflight's catalogue of a vLLM release from the release itself.

    python scripts/gen_vllm_catalogue.py 0.33.0 0.28.0 0.13.0 0.10.2      # or no arguments: every line we ship

For each version: download the vLLM wheel from the package index (``pip download --no-deps``), unpack it into a
throw-away directory, and run scripts/vllm_catalogue_inside.py with it first on the path inside a throw-away
virtual environment that holds vLLM's pure-Python dependencies and a CPU torch. That script builds the parser of
``vllm serve`` (no GPU: modules it does not need are mocked as vLLM's own docs build does) and reads the model
registry, quantization methods and KV-cache dtypes from the release's source. The result is written to
``service/data/vllm/<version>.json`` with the wheel's file name and SHA-256. vLLM is never a runtime dependency.

Beside it, ``service/data/vllm/loading/<version>.json`` holds what each option, nested JSON field and environment
variable can make the release load (imports, unpickles, file reads and writes, download places, other weights,
secrets), found by scripts/vllm_loading.py reading the same wheel's source; ``--loading-only`` regenerates those
files alone from the wheel each catalogue records (no environment needed: the analysis only parses the source).

``argparse`` in each catalogue says whether the release's ``vllm serve`` parser accepts abbreviated long options
(argparse's ``allow_abbrev``) and which help strings a prefix is matched against: the full generation reads it from
the parser it builds; ``--argparse-only`` fills it into the checked-in catalogues from each recorded wheel's source
alone (scripts/vllm_argparse.py: an ``ast`` read, no environment), leaving every other key as it is.

``service/data/vllm/names/<version>.json`` holds the names the release accepts where a value is looked up in a
registry or an enum (reasoning and tool-call parsers, attention and Mamba backends), each with the file and line that
defines it, read from the wheel's source by scripts/vllm_names.py (``--names-only``: those files alone, no
environment). ``--registry-only`` reads the model registry into the checked-in catalogues again from each recorded
wheel's source (an ``ast`` read, as the full generation does), leaving every other key as it is.

Also beside it, ``service/data/vllm/quant_overrides/<version>.json`` holds how the release reconciles a checkpoint's
quantization config with ``--quantization`` (the order in which ModelConfig._verify_quantization asks each method's
``override_quantization_method``, and where each override is defined), and
``tests/fixtures/vllm_quant_overrides/<version>.json`` the release's own verdicts on a grid of checkpoint configs × user
values × model types × GPUs, which Preflight's reading of those overrides must reproduce; both come from
scripts/vllm_quant_overrides_inside.py, run in the same environment on the wheel's unpacked source
(``--quant-overrides-only`` regenerates those files alone).

``--catalogue-only`` regenerates the catalogues alone (the parser's options with their value facts, the registry,
…), leaving the loading and override facts as they are.

The work directory (default /tmp/preflight-vllm-gen) is kept so that a second run reuses the environment and the
wheels. ``--torch`` names the torch requirement (default ``torch==2.13.0``; any CPU build works).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import zipfile

from vllm_argparse import argparse_facts
from vllm_catalogue_inside import registry
from vllm_loading import analyse
from vllm_names import names

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "service" / "data" / "vllm"
INSIDE = pathlib.Path(__file__).resolve().parent / "vllm_catalogue_inside.py"
QUANT_INSIDE = pathlib.Path(__file__).resolve().parent / "vllm_quant_overrides_inside.py"
QUANT_GRID = ROOT / "tests" / "fixtures" / "vllm_quant_overrides"
# What the parser imports for real (the rest is mocked): pure-Python packages and a CPU torch.
SUPPORT = [
    "pydantic",
    "packaging",
    "regex",
    "huggingface_hub",
    "cachetools",
    "psutil",
    "numpy",
    "msgspec",
    "pyyaml",
    "cloudpickle",
    "requests",
    "tqdm",
    "filelock",
    "transformers",
    "safetensors",
    "tokenizers",
    "pyzmq",
    "blake3",
    "optree",
    "typing_extensions",
]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def env_dir(work: pathlib.Path, transformers_spec: str | None = None, extra: tuple[str, ...] = ()) -> pathlib.Path:
    """Where ``ensure_env`` keeps the environment for these requirements (``.ready`` inside once built)."""
    key = " ".join(filter(None, (transformers_spec, *extra)))
    return work / ("env" if not key else "env-" + hashlib.sha256(key.encode()).hexdigest()[:8])


def ensure_env(
    work: pathlib.Path, torch_spec: str, transformers_spec: str | None = None, extra: tuple[str, ...] = ()
) -> pathlib.Path:
    """A virtual environment with SUPPORT and a CPU torch (``extra``: more requirements, in an environment of
    their own; the differential harness adds what vLLM's model modules import)."""
    env = env_dir(work, transformers_spec, extra)
    key = " ".join(filter(None, (transformers_spec, *extra)))
    py = env / "bin" / "python"
    marker = env / ".ready"
    if not marker.exists():
        run([sys.executable, "-m", "venv", str(env)])
        support = [p for p in SUPPORT if not (transformers_spec and p == "transformers")]
        wanted = [torch_spec, *support, *([transformers_spec] if transformers_spec else []), *extra]
        run([str(py), "-m", "pip", "install", "--quiet", *wanted])
        marker.write_text(f"{torch_spec} {key}")
    return py


def wheel_for(version: str, work: pathlib.Path) -> pathlib.Path:
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels), f"vllm=={version}"])
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no wheel for vllm=={version}")
    return found[0]


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release_source(version: str, wheel: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """The wheel's ``vllm/**.py`` unpacked (all the loading analysis reads)."""
    target = work / "src" / version
    if not (target / "vllm" / "__init__.py").exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    return target


def loading_of(version: str, wheel: pathlib.Path, work: pathlib.Path) -> dict:
    """The release's loading facts, with the wheel they were read from."""
    facts = analyse(release_source(version, wheel, work))
    return {**facts, "vllm_version": version, "source": {"wheel": wheel.name, "sha256": sha256(wheel)}}


def recorded_wheel(version: str, path: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """The wheel a checked-in catalogue was generated from (checked by SHA-256)."""
    recorded = json.loads(path.read_text())["source"]["sha256"]
    wheel = wheel_for(version, work)
    if sha256(wheel) != recorded:
        raise SystemExit(f"{wheel.name}: SHA-256 differs from the one {path.name} was generated from")
    return wheel


def loading_only(version: str, path: pathlib.Path, work: pathlib.Path) -> dict:
    """The loading facts of the release a checked-in catalogue was generated from."""
    return loading_of(version, recorded_wheel(version, path, work), work)


def argparse_only(version: str, path: pathlib.Path, work: pathlib.Path) -> dict:
    """The checked-in catalogue with its ``argparse`` facts read from the recorded wheel's source."""
    source = release_source(version, recorded_wheel(version, path, work), work)
    return {**json.loads(path.read_text()), "argparse": argparse_facts(source)}


def registry_only(version: str, path: pathlib.Path, work: pathlib.Path) -> dict:
    """The checked-in catalogue with its ``registry`` read again from the recorded wheel's source (``registry`` in
    scripts/vllm_catalogue_inside.py reads only files, with ``ast``)."""
    source = release_source(version, recorded_wheel(version, path, work), work)
    return {**json.loads(path.read_text()), "registry": registry(source / "vllm")}


def names_of(version: str, wheel: pathlib.Path, work: pathlib.Path) -> dict:
    """The parser and backend names the release accepts (scripts/vllm_names.py), with the wheel they come from."""
    facts = names(release_source(version, wheel, work))
    source = {"wheel": wheel.name, "sha256": sha256(wheel), "generator": "scripts/vllm_names.py"}
    return {"vllm_version": version, "source": source, **facts}


def release_dir(version: str, py: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """The release installed alone (``--no-deps``) into its own directory, for ``PYTHONPATH``."""
    target = work / "releases" / version
    if not (target / "vllm").exists():
        run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                str(wheel_for(version, work)),
            ]
        )
    return target


def quant_overrides_of(version: str, py: pathlib.Path, work: pathlib.Path) -> tuple[dict, dict]:
    """The release's quantization override facts and its verdict grid, each with the wheel they were read from.
    Run on the wheel's unpacked ``vllm/**.py`` (no compiled code is on an override's path)."""
    wheel = wheel_for(version, work)
    env = {**os.environ, "PYTHONPATH": str(release_source(version, wheel, work)), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([str(py), str(QUANT_INSIDE)], check=True, capture_output=True, text=True, env=env, cwd=work)
    data = json.loads(out.stdout)
    if data["vllm_version"] != version:
        raise SystemExit(f"asked for {version}, the source says {data['vllm_version']}")
    source = {"wheel": wheel.name, "sha256": sha256(wheel), "generator": "scripts/vllm_quant_overrides_inside.py"}
    grid = {"vllm_version": version, "source": source, **data.pop("grid")}
    return {**data, "source": source}, grid


def generate(
    version: str, py: pathlib.Path, work: pathlib.Path, transformers_spec: str | None = None, loading: bool = True
) -> tuple[dict, dict | None]:
    """The release's catalogue and its loading facts (None with ``loading=False``)."""
    wheel = wheel_for(version, work)
    target = release_dir(version, py, work)
    env = {**os.environ, "PYTHONPATH": str(target), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([str(py), str(INSIDE)], check=True, capture_output=True, text=True, env=env, cwd=work)
    data = json.loads(out.stdout)
    if data["vllm_version"] != version:
        raise SystemExit(f"asked for {version}, the wheel says {data['vllm_version']}")
    data["source"] = {
        "wheel": wheel.name,
        "sha256": sha256(wheel),
        "generator": "scripts/gen_vllm_catalogue.py + scripts/vllm_catalogue_inside.py",
    }
    if transformers_spec:
        data["source"]["transformers_requirement"] = transformers_spec
    return data, loading_of(version, wheel, work) if loading else None


def write_or_check(path: pathlib.Path, data: dict, check: bool, seconds: float) -> int:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if check:
        same = path.exists() and json.loads(path.read_text()) == json.loads(text)
        print(f"{path.name}: {'same' if same else 'DIFFERS'} ({seconds:.1f} s)", flush=True)
        return 0 if same else 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if "cells" in data:
        counts = f"{len(data['cells'])} grid cells, {len(data['outcomes'])} distinct verdicts"
    elif "order" in data:
        counts = f"{len(data['order'])} methods asked, {len(data['methods'])} with an override"
    elif "tool_parsers" in data:
        counts = ", ".join(f"{len(v)} {k}" for k, v in data.items() if k not in ("vllm_version", "source"))
    elif "env" in data:
        counts = f"{len(data['options'])} loading options, {len(data['env'])} env variables"
    else:
        counts = (
            f"{len(data['options'])} options, {len(data['registry']['architectures'])} architectures, "
            f"{len(data['quantization']['methods'])} quantization methods"
        )
    print(f"{path}: {counts} ({seconds:.1f} s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="vLLM releases (default: those in service/data/vllm)")
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/preflight-vllm-gen"))
    ap.add_argument("--torch", default="torch==2.13.0", help="torch requirement for the environment (CPU build)")
    ap.add_argument(
        "--transformers",
        default=None,
        help="a Transformers requirement for releases that do not build with the newest one "
        "(0.8/0.9: 'transformers<4.54')",
    )
    ap.add_argument("--out", type=pathlib.Path, default=DATA)
    ap.add_argument("--check", action="store_true", help="compare with the checked-in files instead of writing")
    ap.add_argument(
        "--loading-only",
        action="store_true",
        help="regenerate only the loading facts (service/data/vllm/loading/), from each wheel",
    )
    ap.add_argument(
        "--argparse-only",
        action="store_true",
        help="fill only the parser facts (allow_abbrev, help strings) into the catalogues, from each wheel's source",
    )
    ap.add_argument(
        "--registry-only",
        action="store_true",
        help="read only the model registry into the catalogues again, from each wheel's source",
    )
    ap.add_argument(
        "--names-only",
        action="store_true",
        help="regenerate only the parser and backend names (service/data/vllm/names/), from each wheel's source",
    )
    ap.add_argument(
        "--catalogue-only",
        action="store_true",
        help="regenerate only the catalogues (service/data/vllm/<version>.json), not the loading and override facts",
    )
    ap.add_argument(
        "--quant-overrides-only",
        action="store_true",
        help="regenerate only the quantization override facts and verdict grids (quant_overrides/, tests/fixtures/)",
    )
    args = ap.parse_args(argv)
    versions = args.versions or sorted(p.stem for p in args.out.glob("*.json"))
    args.work.mkdir(parents=True, exist_ok=True)
    status = 0
    for version in versions:
        t0 = time.monotonic()
        spec = args.transformers
        existing = args.out / f"{version}.json"
        if spec is None and existing.exists():  # regenerate a line in the environment it was made in
            spec = json.loads(existing.read_text()).get("source", {}).get("transformers_requirement")
        try:
            if args.loading_only:
                outputs = {args.out / "loading" / f"{version}.json": loading_only(version, existing, args.work)}
            elif args.argparse_only:
                outputs = {existing: argparse_only(version, existing, args.work)}
            elif args.registry_only:
                outputs = {existing: registry_only(version, existing, args.work)}
            elif args.names_only:
                wheel = recorded_wheel(version, existing, args.work)
                outputs = {args.out / "names" / f"{version}.json": names_of(version, wheel, args.work)}
            elif args.quant_overrides_only:
                facts, grid = quant_overrides_of(version, ensure_env(args.work, args.torch, spec), args.work)
                outputs = {
                    args.out / "quant_overrides" / f"{version}.json": facts,
                    QUANT_GRID / f"{version}.json": grid,
                }
            elif args.catalogue_only:
                py = ensure_env(args.work, args.torch, spec)
                outputs = {existing: generate(version, py, args.work, spec, loading=False)[0]}
            else:
                py = ensure_env(args.work, args.torch, spec)
                data, loading = generate(version, py, args.work, spec)
                facts, grid = quant_overrides_of(version, py, args.work)
                outputs = {
                    existing: data,
                    args.out / "names" / f"{version}.json": names_of(version, wheel_for(version, args.work), args.work),
                    args.out / "loading" / f"{version}.json": loading,
                    args.out / "quant_overrides" / f"{version}.json": facts,
                    QUANT_GRID / f"{version}.json": grid,
                }
        except subprocess.CalledProcessError as e:
            tail = (e.stderr or "").strip().splitlines()[-3:] if isinstance(e.stderr, str) else []
            print(f"{version}: FAILED ({' | '.join(tail)})", file=sys.stderr)
            status = 1
            continue
        for path, content in outputs.items():
            status |= write_or_check(path, content, args.check, time.monotonic() - t0)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
