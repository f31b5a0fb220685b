"""``preflight upgrade-check``: what a vLLM upgrade (or downgrade) would break among the active plans."""

import json

import typer

from . import common


def _print_impact(out: dict) -> None:
    typer.echo(
        f"vLLM {out['vllm_version']} (catalogue {out['catalogue']}): {out['checked']} plans checked, "
        f"{out['breaking']} would break"
    )
    for p in out["plans"]:
        if not p["breaks"]:
            continue
        typer.echo(
            f"BREAKS plan {p['plan']} ({p['manifest']}, {p['from_version']} -> {p['to_version']}, nodes "
            f"{', '.join(p['nodes']) or '-'})"
        )
        for f in p["findings"]:
            remedy = f" remedy {json.dumps(f['remedy'])}" if f.get("remedy") else ""
            typer.echo(f"  {f['rule']}: {f['message']}{remedy}")


def upgrade_check(
    to: str = typer.Option(..., "--to", help="The vLLM version to upgrade (or downgrade) to, e.g. 0.33"),
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
    as_json: bool = typer.Option(False, "--json", help="Print the service's answer as JSON."),
) -> None:
    """Re-validate every active plan against another vLLM version and list what would break.

    Every active plan and every manifest's newest plan. Exit 0 nothing breaks, 1 something breaks, 2 bad input."""
    r = common.client(server, token).get("/v1/upgrade-impact", params={"vllm_version": to})
    if r.status_code == 422:
        typer.echo(f"preflight: {r.json().get('detail', r.text)}", err=True)
        raise typer.Exit(2)
    common.fail_on_problem(r)
    out = r.json()
    if as_json:
        typer.echo(json.dumps(out, indent=1))
    else:
        _print_impact(out)
    raise typer.Exit(1 if out["breaking"] else 0)
