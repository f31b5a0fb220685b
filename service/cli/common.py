"""What the command groups share: the service's settings and database (commands run beside the service), the HTTP
client of commands that call it, problem answers as a person reads them, and text from the service made printable.

Everything heavy (httpx, SQLAlchemy, the settings' pydantic models) is imported inside the function that needs it:
``preflight check`` and the agent load none of what they do not use."""

from __future__ import annotations

import typer

from ..domain.text import printable


def settings():
    from ..settings import Settings

    try:
        return Settings()
    except Exception as exc:  # pydantic ValidationError: say it plainly
        typer.echo(f"preflight: invalid settings: {exc}", err=True)
        raise typer.Exit(2)


def database(settings_=None):
    """The database of the settings, with the service's audit MAC keys when the key directory is at hand (events
    the CLI writes are then accepted by the sealer, and verify checks every MAC); never creates a key."""
    from ..audit import AuditKeys
    from ..db.session import Database
    from ..signing import KeyError_, KeyStore

    settings_ = settings_ or settings()
    try:
        keys = AuditKeys(KeyStore(settings_.key_dir, create=False))
    except (KeyError_, OSError, ValueError):
        keys = None
    return Database(settings_.resolved_database_url, audit_keys=keys)


def client(server: str, token: str):
    """An HTTP client of the service, authenticated with ``token`` (tests replace it with one of their app)."""
    import httpx

    return httpx.Client(base_url=server.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=30)


def fail_on_problem(r) -> None:
    if r.status_code >= 400:
        typer.echo(f"preflight: HTTP {r.status_code}: {problem_text(r)}", err=True)
        raise typer.Exit(1)


def problem_text(r) -> str:
    """A problem+json answer as a person reads it: the detail, then each field error and finding on its own line
    (control characters escaped: the text comes from the server); anything else as sent, cut at 2,000 characters."""
    try:
        body = r.json()
    except ValueError:
        return printable(r.text[:2000], keep="\n\t")
    if not isinstance(body, dict) or not isinstance(body.get("detail") or body.get("title"), str):
        return printable(r.text[:2000], keep="\n\t")
    lines = [str(body.get("detail") or body.get("title"))]
    for e in (body.get("errors") or [])[:20]:
        if isinstance(e, dict):
            lines.append(f"  {e.get('field', '')}: {e.get('message', '')}")
    for f in (body.get("findings") or [])[:20]:
        if isinstance(f, dict) and f.get("severity") == "error":
            lines.append(f"  [{f.get('rule', '')}] {f.get('message', '')}")
    return printable("\n".join(lines), keep="\n\t")


def safe(text, limit: int = 500) -> str:
    """One line of text from the service as printable: every control and format character escaped (\\x1b,
    \\u202e; newlines and tabs too), never emitted; at most ``limit`` characters."""
    text = str(text)
    return printable(text[:limit]) + ("…" if len(text) > limit else "")
