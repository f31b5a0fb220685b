"""``preflight keys``: the service's signing keys (run beside the service, on its key directory)."""

import json
import pathlib

import typer

from . import common

keys_app = typer.Typer(help="Signing keys.", no_args_is_help=True, rich_markup_mode="markdown")


def _audit_key_event(kind: str, payload: dict) -> None:
    """Record a key change in the audit log when the database is reachable (a key change must not depend on it)."""
    from .. import audit

    try:
        with common.database().transaction() as s:
            audit.append(s, actor="cli", kind=kind, subject=f"key:{payload.get('kid')}", payload=payload)
    except Exception as exc:  # the key change itself stands; say that the log missed it
        typer.echo(f"preflight: warning: could not record {kind} in the audit log: {exc.__class__.__name__}", err=True)


@keys_app.command("rotate")
def keys_rotate() -> None:
    """Create a new active signing key; older keys stay published until retired."""
    from ..signing import KeyStore

    kid = KeyStore(common.settings().key_dir).rotate()
    _audit_key_event("key.rotated", {"kid": kid})
    typer.echo(kid)


@keys_app.command("init")
def keys_init() -> None:
    """Create the first signing key if the key directory has none (the one explicit step production needs)."""
    from ..signing import KeyStore

    ks = KeyStore(common.settings().key_dir, create=True)
    typer.echo(ks.active_kid)


def _plans_signed_with(kid: str) -> set[str]:
    """The ids of the active plans signed with ``kid`` (read from the service's database)."""
    from sqlalchemy import select

    from ..db.models import Assignment
    from ..signing import b64json

    in_use: set[str] = set()
    with common.database(common.settings()).read() as session:
        for plan_id, signed in session.execute(
            select(Assignment.plan_id, Assignment.signed).where(Assignment.status == "active")
        ):
            head = signed.split(".", 1)[0]
            try:
                if b64json(head).get("kid") == kid:
                    in_use.add(plan_id)
            except (ValueError, AttributeError):
                continue
    return in_use


def _refuse_if_in_use(kid: str) -> None:
    try:
        in_use = _plans_signed_with(kid)
    except Exception as exc:  # a retirement that cannot be checked is not made by default
        typer.echo(
            f"preflight: cannot check which active plans are signed with {kid} (database: "
            f"{exc.__class__.__name__}); run it where PREFLIGHT_DATABASE_URL reaches the service's "
            f"database, or --force",
            err=True,
        )
        raise typer.Exit(1)
    if in_use:
        shown = ", ".join(sorted(in_use)[:5]) + (" …" if len(in_use) > 5 else "")
        typer.echo(
            f"preflight: {len(in_use)} active plan(s) are signed with {kid} ({shown}); their nodes would "
            f"refuse them at the next boot. Reissue them first (POST /v1/plans/ID/reissue), or --force.",
            err=True,
        )
        raise typer.Exit(1)


@keys_app.command("retire")
def keys_retire(
    kid: str,
    force: bool = typer.Option(
        False, "--force", help="Retire it even while active plans are signed with it (their nodes stop booting)."
    ),
) -> None:
    """Stop publishing a key (plans it signed stop verifying). Refused while active plans are signed with it: reissue
    those first (``POST /v1/plans/{id}/reissue`` signs with the active key)."""
    from ..signing import KeyError_, KeyStore

    if not force:
        _refuse_if_in_use(kid)
    try:
        KeyStore(common.settings().key_dir, create=False).retire(kid)
    except KeyError_ as exc:
        typer.echo(f"preflight: {exc}", err=True)
        raise typer.Exit(2)
    _audit_key_event("key.retired", {"kid": kid})
    typer.echo(f"retired {kid}")


@keys_app.command("export")
def keys_export(out: pathlib.Path | None = typer.Option(None, help="Write here (default: stdout).")) -> None:
    """Write the public key set and its version: a node's trust file (``agent run --trust``), at provisioning."""
    from ..agent.trust import write_atomic
    from ..signing import KeyStore

    jwks = KeyStore(common.settings().key_dir, create=False).jwks()
    if out:
        write_atomic(out, jwks)
        typer.echo(f"wrote key set version {jwks['version']} ({len(jwks['keys'])} keys) to {out}")
    else:
        typer.echo(json.dumps(jwks, indent=2))


@keys_app.command("list")
def keys_list() -> None:
    """Print the published JWKS."""
    from ..signing import KeyStore

    typer.echo(json.dumps(KeyStore(common.settings().key_dir).jwks(), indent=2))
