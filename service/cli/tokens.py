"""``preflight tokens``: bearer tokens (admin)."""

import json

import typer

from . import common

tokens_app = typer.Typer(help="Bearer tokens (admin).", no_args_is_help=True, rich_markup_mode="markdown")


@tokens_app.command("create")
def tokens_create(
    role: str = typer.Argument(
        ...,
        help="admin, deployer, auditor or enroller (creates nodes and updates their hardware facts: `preflight agent register`)",
    ),
    label: str | None = None,
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
) -> None:
    """Create a token; the secret is printed once."""
    r = common.client(server, token).post("/v1/tokens", json={"role": role, "label": label})
    common.fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))


@tokens_app.command("list")
def tokens_list(
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"), token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN")
) -> None:
    """List tokens (never their secrets)."""
    r = common.client(server, token).get("/v1/tokens", params={"limit": 500})
    common.fail_on_problem(r)
    for t in r.json()["items"]:
        typer.echo(
            f"{t['id']:>5}  {t['role']:<9} {t['node'] or '-':<20} {'revoked' if t['revoked_at'] else 'active':<8} "
            f"{t['label'] or ''}"
        )


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: int,
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
) -> None:
    """Revoke a token."""
    r = common.client(server, token).post(f"/v1/tokens/{token_id}/revoke")
    common.fail_on_problem(r)
    typer.echo(json.dumps(r.json()))


@tokens_app.command("rotate")
def tokens_rotate(
    token_id: int,
    server: str = typer.Option(..., envvar="PREFLIGHT_SERVER"),
    token: str = typer.Option(..., envvar="PREFLIGHT_TOKEN"),
) -> None:
    """Revoke a token and print its replacement (same role, node, label)."""
    r = common.client(server, token).post(f"/v1/tokens/{token_id}/rotate")
    common.fail_on_problem(r)
    typer.echo(json.dumps(r.json(), indent=2))
