"""The ``preflight`` command line (Typer): serve, migrate, check, manifest push, agent run/verify, keys, audit,
rollouts, tuning, tokens and upgrade-check — one module per group. Each module imports what its commands use when
they run, so ``preflight check`` and the agent load neither httpx (check) nor the service's web and database
stack. The command modules keep their annotations evaluated (no ``from __future__ import annotations``): Typer
reads every command's signature at each start, and string annotations would be evaluated then, for all 40."""

from __future__ import annotations

import sys

import typer

from . import agent, audit, check, keys, manifest, rollout, server, tokens, tune, upgrade
from .common import printable

app = typer.Typer(help="Preflight: validate, sign and audit vLLM launch configurations.", no_args_is_help=True,
                  rich_markup_mode="markdown")
app.command()(server.migrate)
app.command()(server.serve)
app.command()(check.check)
app.command("upgrade-check")(upgrade.upgrade_check)
app.add_typer(manifest.manifest_app, name="manifest")
app.add_typer(agent.agent_app, name="agent")
app.add_typer(keys.keys_app, name="keys")
app.add_typer(audit.audit_app, name="audit")
app.add_typer(rollout.rollout_app, name="rollout")
app.add_typer(tune.tune_app, name="tune")
app.add_typer(tokens.tokens_app, name="tokens")


def _reflow_help(*apps: typer.Typer) -> None:
    """Typer's Rich help keeps a docstring's source line breaks (a ragged run-on block in ``--help`` and in the
    command lists): each paragraph becomes one line, which Rich wraps to the terminal; the first paragraph is what
    the command lists show."""
    import inspect

    for a in apps:
        for info in a.registered_commands:
            doc = info.help or inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())
        _reflow_help(*(g.typer_instance for g in a.registered_groups if g.typer_instance is not None))


_reflow_help(app)  # every command of every group, registered above


def _unreachable(e: Exception) -> bool:
    """Whether ``e`` says the service cannot be reached (httpx is imported only by commands that call it: an
    exception of a command that never imported it is not one)."""
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(e, (httpx.TransportError, httpx.InvalidURL))


def _say_unreachable(e: Exception) -> None:
    httpx = sys.modules["httpx"]
    reason = str(e) or e.__class__.__name__
    hint = " (give the address with http:// or https://)" if isinstance(e, httpx.UnsupportedProtocol) else ""
    try:
        u = e.request.url
        where = f" at {u.scheme}://{u.netloc.decode('ascii', 'replace')}"
    except (AttributeError, RuntimeError):  # no request was built (an unusable URL)
        where = ""
    keep = "\n\t"
    typer.echo(f"preflight: cannot reach the service{printable(where, keep)}: {printable(reason, keep)}{hint}",
               err=True)


def main() -> None:
    """The ``preflight`` command: the CLI, with a service that cannot be reached said in one line (not a
    traceback) and exit status 69 (EX_UNAVAILABLE)."""
    try:
        app()
    except Exception as e:
        if not _unreachable(e):
            raise
        _say_unreachable(e)
        sys.exit(69)
