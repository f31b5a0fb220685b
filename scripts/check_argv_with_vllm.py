"""Parse rendered ``vllm serve`` argvs with vLLM's own parser and compare with what Preflight validated.

    python scripts/check_argv_with_vllm.py CASES.jsonl      # run where vLLM is importable (e.g. the generator's
                                                            # environment with PYTHONPATH=/tmp/preflight-vllm-gen/releases/0.33.0)

Each input line: ``{"argv": [...], "expected": {dest: value}, "model": "..."}``. The argv is parsed exactly as the
``vllm`` command does (FlexibleArgumentParser with the serve subcommand, scripts/vllm_catalogue_inside.py builds
it with unneeded modules mocked); every expected dest must come out equal. Prints one line per mismatch and a
summary; exit 1 on any mismatch.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import vllm_catalogue_inside as inside  # noqa: E402


def plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    if type(value).__name__ == "LoRAModulePath":  # --lora-modules items: compare as Preflight renders them
        return (
            f"{value.name}={value.path}"
            if value.base_model_name is None
            else json.dumps(
                {"name": value.name, "path": value.path, "base_model_name": value.base_model_name},
                separators=(",", ":"),
                sort_keys=True,
            )
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):
        return value.value
    return value


def same(expected, got) -> bool:
    if isinstance(expected, str) and isinstance(got, list):  # a type callable that splits a comma list (--device-ids)
        return expected.replace(" ", "") == ",".join(map(str, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return all(k in got and same(v, got[k]) for k, v in expected.items())
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return abs(float(expected) - float(got)) < 1e-9
        except (TypeError, ValueError):
            return False
    return expected == got


def main(path: str) -> int:
    parser = inside.build_serve_parser()
    FAP = inside.auto_import("vllm.utils.argparse_utils", "FlexibleArgumentParser")
    bad = total = 0
    for line in pathlib.Path(path).read_text().splitlines():
        case = json.loads(line)
        total += 1
        argv = case["argv"]
        try:
            # the `vllm serve` path: FlexibleArgumentParser.parse_args(["serve", MODEL, ...]) preprocessing, then
            # the serve options; the subcommand name is consumed by the top-level parser in vllm/entrypoints/cli
            top = FAP(prog="vllm")
            subs = top.add_subparsers(dest="subparser")
            sub = subs.add_parser("serve")
            for action in parser._actions:
                if action.option_strings and "--help" in action.option_strings:
                    continue
                sub._add_action(action)
            ns = top.parse_args(["serve", *argv[2:]])
        except SystemExit as e:
            bad += 1
            print(f"PARSE ERROR ({e.code}): {argv}")
            continue
        got_model = getattr(ns, "model_tag", None) or getattr(ns, "model", None)
        if got_model != case["model"]:
            bad += 1
            print(f"MODEL {got_model!r} != {case['model']!r}: {argv}")
        for dest, expected in case["expected"].items():
            got = plain(getattr(ns, dest, None))
            if not same(expected, got):
                bad += 1
                print(f"MISMATCH {dest}: expected {expected!r}, vLLM parsed {got!r}: {argv}")
    print(f"{total} argvs, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
