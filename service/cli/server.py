"""Running the service: ``preflight serve``, ``preflight migrate`` and the bootstrap admin token."""

import os

import typer

from .common import settings


def bootstrap_admin_token(settings, db) -> tuple[str | None, bool]:
    """The admin token to print: PREFLIGHT_ADMIN_TOKEN, or one generated on first start (kept in the data dir,
    mode 0600, and stored hashed in the database). Returns (token, generated_now); the token is None when the one
    kept in the data dir has been revoked (a dead token is never printed)."""
    from ..services import tokens

    if settings.admin_token:
        return None, False
    path = settings.data_dir / "admin-token"
    if path.exists():
        kept = path.read_text().strip()
        with db.transaction() as s:
            live = tokens.is_live(s, kept)
        return (kept if live else None), False
    with db.transaction() as s:
        secret, row = tokens.create(s, role="admin", label="bootstrap admin token")
        from .. import audit

        audit.append(  # names the row like every token.created: verify finds the event of each token
            s,
            actor="preflight",
            kind="token.created",
            subject=f"token:{row.id}",
            payload={"id": row.id, "role": "admin", "label": "bootstrap admin token"},
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return secret, True


def migrate() -> None:
    """Apply the database migrations (Alembic upgrade head)."""
    from ..db.migrate import upgrade

    s = settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(s.resolved_database_url)
    typer.echo(f"migrated {s.resolved_database_url.split('@')[-1]}")


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port."),
    workers: int = typer.Option(1, help="uvicorn worker processes."),
    no_migrate: bool = typer.Option(False, "--no-migrate", help="Do not apply migrations first."),
) -> None:
    """Run the HTTP service (applies migrations, creates the signing key and admin token on first start)."""
    import uvicorn

    from ..audit import AuditKeys
    from ..db.migrate import upgrade
    from ..db.session import Database
    from ..signing import KeyError_, KeyStore

    s = settings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    if not no_migrate:
        upgrade(s.resolved_database_url)
    try:
        keys = KeyStore(s.key_dir, create=s.env != "production")
    except KeyError_ as exc:
        typer.echo(
            f"preflight: refusing to start: {exc} (production never generates a key: run `preflight keys "
            f"init` once, or mount the keys at PREFLIGHT_SIGNING_KEY_DIR)",
            err=True,
        )
        raise typer.Exit(2)
    db = Database(s.resolved_database_url, audit_keys=AuditKeys(keys))
    token, generated = bootstrap_admin_token(s, db)
    typer.echo(
        f"Preflight on http://{host}:{port}  (fleet page: http://{host}:{port}/ui/, API docs: "
        f"http://{host}:{port}/docs)"
    )
    typer.echo(f"database: {s.resolved_database_url.split('@')[-1]}; signing key: {keys.active_kid}")
    if token:
        typer.echo(f"admin token{' (new)' if generated else ''}: {token}")
    elif s.admin_token:
        typer.echo("admin token: the value of PREFLIGHT_ADMIN_TOKEN")
    else:
        typer.echo(
            f"admin token: the one in {s.data_dir / 'admin-token'} has been revoked (not printed); use another "
            "admin token, or set PREFLIGHT_ADMIN_TOKEN"
        )
    uvicorn.run(
        "service.api.main:app", host=host, port=port, workers=workers, log_level="warning", access_log=False
    )  # access lines come from the app, as JSON with a request id
