"""Generate what Preflight knows about the Transformers a vLLM release runs with: which model classes
``getattr(transformers, architecture)`` finds there and whether vLLM's Transformers backend accepts them.

    python scripts/gen_transformers_models.py                 # every release in service/data/vllm
    python scripts/gen_transformers_models.py 0.33.0 0.10.2   # some of them

For each release: the Transformers requirement of its wheel (METADATA ``Requires-Dist: transformers``; narrowed by
the ``transformers_requirement`` its catalogue was generated under, where one is recorded: a release that does not
build with a newer Transformers does not run with it either), the oldest and the newest published Transformers it
allows (``pip index versions transformers``), and the suffix table vLLM rewrites architecture names with
(``_SUFFIX_TO_DEFAULTS``, read from the release's source with ``ast``). Written to
``service/data/vllm/transformers/releases.json``.

For each of those Transformers versions not yet generated: its wheel is downloaded, installed with its own
dependencies into a throw-away directory and scripts/transformers_models_inside.py runs with it first on the path,
in the catalogue generator's environment (it has a CPU torch); the model classes and their flags are written to
``service/data/vllm/transformers/<transformers version>.json``. The vLLM catalogues themselves are not touched.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import zipfile

from gen_vllm_catalogue import DATA, ensure_env, release_source, run, sha256, wheel_for
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

OUT = DATA / "transformers"
INSIDE = pathlib.Path(__file__).resolve().parent / "transformers_models_inside.py"


def wheel_requirement(wheel: pathlib.Path) -> str:
    """The wheel's own ``Requires-Dist: transformers`` specifier (without an extra)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.name.lower() == "transformers" and not (req.marker and "extra" in str(req.marker)):
                return str(req.specifier)
    raise SystemExit(f"{wheel.name}: no transformers requirement")


def published_versions() -> list[Version]:
    """Every final Transformers release the package index lists (pip's own client)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "transformers"], check=True, capture_output=True, text=True
    ).stdout
    listed = re.search(r"Available versions: (.*)", out)
    if not listed:
        raise SystemExit("pip index versions transformers: no versions listed")
    found = [Version(v.strip()) for v in listed.group(1).split(",")]
    return sorted(v for v in found if not v.is_prerelease and not v.is_devrelease)


def bounds(spec: str, narrower: str | None, versions: list[Version]) -> list[str]:
    """The oldest and the newest published version ``spec`` (and ``narrower``) allow."""
    allowed = SpecifierSet(spec) & (Requirement(narrower).specifier if narrower else SpecifierSet())
    fitting = [v for v in versions if v in allowed]
    if not fitting:
        raise SystemExit(f"no published transformers satisfies {spec} {narrower or ''}")
    return sorted({str(fitting[0]), str(fitting[-1])}, key=Version)


def suffix_defaults(source: pathlib.Path) -> dict | None:
    """``_SUFFIX_TO_DEFAULTS`` (architecture suffix -> default runner and convert) with where the release defines
    it; None before vLLM 0.10 (no suffix rewrite)."""
    for path in sorted((source / "vllm" / "config").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "_SUFFIX_TO_DEFAULTS" and node.value is not None:
                table = ast.literal_eval(node.value)
                return {
                    "at": f"{path.relative_to(source)}:{node.lineno}",
                    "table": [[suffix, runner, convert] for suffix, (runner, convert) in table],
                }
    return None


def transformers_fallback(source: pathlib.Path) -> str | None:
    """Where the release looks an architecture up in Transformers (``getattr(transformers, ...)``): the model
    registry (0.10 on) or the model loader (0.7-0.9); None when it has no Transformers fallback (0.6)."""
    for rel in ("vllm/model_executor/models/registry.py", "vllm/model_executor/model_loader/utils.py"):
        path = source / rel
        if not path.exists():
            continue
        for lineno, text in enumerate(path.read_text().splitlines(), 1):
            if "getattr(transformers," in text:
                return f"{rel}:{lineno}"
    return None


def release_facts(version: str, work: pathlib.Path, versions: list[Version]) -> dict:
    wheel = wheel_for(version, work)
    catalogue = DATA / f"{version}.json"
    narrower = None
    if catalogue.exists():
        narrower = json.loads(catalogue.read_text()).get("source", {}).get("transformers_requirement")
    spec = wheel_requirement(wheel)
    source = release_source(version, wheel, work)
    return {
        "transformers_fallback": transformers_fallback(source),
        "requirement": spec,
        "catalogue_transformers_requirement": narrower,
        "transformers": bounds(spec, narrower, versions),
        "suffix_defaults": suffix_defaults(source),
        "wheel": wheel.name,
        "sha256": sha256(wheel),
    }


def classes_of(tf_version: str, py: pathlib.Path, work: pathlib.Path) -> dict:
    """The model classes of one Transformers release, read inside the environment with it installed."""
    wheels = work / "transformers-wheels"
    found = sorted(wheels.glob(f"transformers-{tf_version}-*.whl"))
    if not found:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "-d",
                str(wheels),
                f"transformers=={tf_version}",
            ]
        )
        found = sorted(wheels.glob(f"transformers-{tf_version}-*.whl"))
    target = work / "transformers" / tf_version
    if not (target / "transformers").exists():
        run([str(py), "-m", "pip", "install", "--quiet", "--target", str(target), str(found[0])])
    env = {**os.environ, "PYTHONPATH": str(target), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([str(py), str(INSIDE)], check=True, capture_output=True, text=True, env=env, cwd=work)
    start = out.stdout.find('{"transformers_version"')  # a library may print a line of its own first
    if start < 0:
        raise SystemExit(f"transformers {tf_version}: no data on stdout ({out.stderr.strip()[-300:]})")
    data = json.loads(out.stdout[start:])
    if data["transformers_version"] != tf_version:
        raise SystemExit(f"asked for transformers {tf_version}, imported {data['transformers_version']}")
    data["source"] = {
        "wheel": found[0].name,
        "sha256": sha256(found[0]),
        "generator": "scripts/gen_transformers_models.py + scripts/transformers_models_inside.py",
    }
    return data


def write(path: pathlib.Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name == "releases.json":
        text = json.dumps(data, indent=1, sort_keys=True)
    else:  # one class a line: a diff between two generations shows the classes that changed
        rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(data["classes"].items()))
        head = json.dumps({k: v for k, v in data.items() if k != "classes"}, sort_keys=True)[:-1]
        text = f'{head}, "classes": {{\n{rows}\n}}}}'
    path.write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="vLLM releases (default: those in service/data/vllm)")
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/preflight-vllm-gen"))
    ap.add_argument("--torch", default="torch==2.13.0", help="torch requirement for the environment (CPU build)")
    ap.add_argument("--force", action="store_true", help="regenerate Transformers versions already generated")
    args = ap.parse_args(argv)
    releases_path = OUT / "releases.json"
    releases = json.loads(releases_path.read_text()) if releases_path.exists() else {}
    wanted = args.versions or sorted((p.stem for p in DATA.glob("*.json")), key=Version)
    published = published_versions()
    for version in wanted:
        releases[version] = release_facts(version, args.work, published)
        print(f"{version}: transformers {releases[version]['requirement']} -> {releases[version]['transformers']}")
    write(releases_path, dict(sorted(releases.items(), key=lambda kv: Version(kv[0]))))
    py = ensure_env(args.work, args.torch)
    needed = {
        v for version in wanted if releases[version]["transformers_fallback"] for v in releases[version]["transformers"]
    }
    for tf_version in sorted(needed, key=Version):
        path = OUT / f"{tf_version}.json"
        if path.exists() and not args.force:
            continue
        t0 = time.monotonic()
        data = classes_of(tf_version, py, args.work)
        write(path, data)
        print(f"{path}: {len(data['classes'])} model classes ({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
