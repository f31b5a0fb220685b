"""``preflight tune``: the tuning loop, from vLLM's live metrics to the next plan."""

import json

import typer

from . import common

tune_app = typer.Typer(
    help="The tuning loop: from vLLM's live metrics to the next plan (docs/operating.md §9).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _print_tuning(out: dict) -> None:
    typer.echo(f"{out.get('node')}: {out.get('state')} ({out.get('action')}); plan {out.get('plan')}")
    cur = out.get("current", {}).get("engine_args", {})
    typer.echo(
        f"  current: max_num_seqs {cur.get('max_num_seqs')}, gpu_memory_utilization {cur.get('gpu_memory_utilization')}"
    )
    nxt = out.get("next")
    typer.echo(
        f"  next:    max_num_seqs {nxt['max_num_seqs']}, gpu_memory_utilization {nxt['gpu_memory_utilization']}"
        if nxt
        else "  next:    keep the current plan"
    )
    for reason in out.get("reasons", []):
        typer.echo(f"  - {reason}")
    ids = [w["id"] for w in out.get("evidence", [])]
    if ids:
        typer.echo(f"  windows: {ids}")


@tune_app.command("status")
def tune_status(
    node: str = typer.Argument(..., help="The node."),
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL."),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A reader's token (admin, deployer, auditor)."),
    as_json: bool = typer.Option(False, "--json", help="The API's answer as JSON."),
) -> None:
    """The tuning loop's state for the node's current plan: what it proposes next, why, and from which windows."""
    r = common.client(server, token).get(f"/v1/nodes/{node}/tuning")
    common.fail_on_problem(r)
    if as_json:
        typer.echo(json.dumps(r.json(), indent=2))
    else:
        _print_tuning(r.json())


@tune_app.command("apply")
def tune_apply(
    node: str = typer.Argument(..., help="The node."),
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER", help="The service's URL."),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN", help="A deployer's or admin's token."),
) -> None:
    """Create the loop's next plan for the node (validated, signed, audited, superseding the current one). Exit 3
    when the loop proposes nothing now (HTTP 409)."""
    r = common.client(server, token).post(f"/v1/nodes/{node}/tuning/apply")
    if r.status_code == 409:
        typer.echo(f"preflight tune: nothing to apply: {r.json().get('detail', r.text)}", err=True)
        raise typer.Exit(3)
    common.fail_on_problem(r)
    out = r.json()
    t = out.get("tuning", {})
    typer.echo(f"plan {out['id']} ({t.get('action')}, from {t.get('from')}): {out['command']}")
