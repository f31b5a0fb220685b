"""``preflight check``: launch-request files validated offline, with nothing but the domain and pydantic loaded (it
runs before any GPU or service is at hand, so it starts fast)."""

import json
import pathlib

import typer


def load_request_file(path: pathlib.Path) -> dict:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("a launch request file must hold one JSON object")
    model = data.get("model")
    if isinstance(model, dict) and model.get("path") and model.get("config") is None:
        d = pathlib.Path(model["path"])
        if not d.is_absolute() and not d.exists():
            d = path.parent / d  # relative to the request file when not relative to the working directory
        model = {"name": str(model["path"]), **model, **read_model_dir(d)}
        pre = d / "preprocessor_config.json"  # image limits of a multimodal model (the encoder's memory profile)
        if model.get("preprocessor_config") is None and pre.is_file():
            model["preprocessor_config"] = json.loads(pre.read_text())
        model.pop("path", None)
        data = {**data, "model": model}
    return data


def read_model_dir(d: pathlib.Path) -> dict:
    """config.json (required), quantization.txt, hf_quant_config.json and the safetensors index's total_size."""
    if not (d / "config.json").is_file():
        raise ValueError(f"{d} has no config.json")
    out: dict = {"config": json.loads((d / "config.json").read_text())}
    if (d / "quantization.txt").is_file():
        out["quantization_txt"] = (d / "quantization.txt").read_text()
    if (d / "hf_quant_config.json").is_file():
        out["hf_quant_config"] = json.loads((d / "hf_quant_config.json").read_text())
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        total = (json.loads(idx.read_text()).get("metadata") or {}).get("total_size")
        if isinstance(total, int):
            out["weights_bytes"] = total
    return out


def print_report(name: str, result) -> None:
    r = result.as_dict()
    typer.echo(f"== {name}: {r['verdict'].upper()}")
    for f in r["findings"]:
        typer.echo(f"  [{f['severity']}] {f['rule']}: {f['message']}")
        if f.get("remedy"):
            typer.echo(f"      remedy: {json.dumps(f['remedy'])}")
    b = r.get("budget")
    if b:
        typer.echo(f"  budget per GPU: weights {b.get('weights_bytes_per_gpu', 0) / 2**30:.2f} GiB, "
                   f"KV cache {b.get('kv_cache_bytes_per_gpu', 0) / 2**30:.2f} GiB")
        if b.get("log_line"):
            typer.echo(f"  {b['log_line']}")
    typer.echo(f"  command: {r['command']}")


def _input_errors(exc: Exception) -> list[dict]:
    """What was wrong with a file that could not be checked, as the JSON output's ``errors``."""
    from pydantic import ValidationError

    from ..domain.errors import DomainError

    if isinstance(exc, ValidationError):
        return [{"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]} for e in exc.errors()]
    if isinstance(exc, DomainError):
        return [exc.as_dict()]
    return [{"field": "file", "rule": "unreadable" if isinstance(exc, OSError) else "invalid_json",
             "message": str(exc)}]


def _print_invalid(path: pathlib.Path, errors: list[dict], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"file": str(path), "verdict": "invalid", "errors": errors}))
    else:
        typer.echo(f"== {path}: INVALID INPUT", err=False)
        for e in errors:
            typer.echo(f"  {e.get('field', '')}: {e.get('message')}")


def check(files: list[pathlib.Path] = typer.Argument(..., help="Launch-request JSON files."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line.")) -> None:
    """Validate launch-request files offline. Exit 0: nothing rejected; 1: a launch is rejected; 2: bad input."""
    from pydantic import ValidationError

    from ..domain.errors import DomainError
    from ..domain.request import LaunchRequest
    from ..domain.validate import validate

    rejected = bad = False
    for path in files:
        try:
            req = LaunchRequest.model_validate(load_request_file(path))
            result = validate(req)
        except (OSError, ValueError, ValidationError, DomainError, RecursionError) as exc:
            bad = True
            if isinstance(exc, RecursionError):  # JSON nested deeper than the parser can go
                exc = ValueError("the file's JSON is nested too deeply")
            _print_invalid(path, _input_errors(exc), as_json)
            continue
        rejected |= result.verdict == "reject"
        if as_json:
            typer.echo(json.dumps({"file": str(path), **result.as_dict()}, separators=(",", ":")))
        else:
            print_report(str(path), result)
    raise typer.Exit(2 if bad else 1 if rejected else 0)
