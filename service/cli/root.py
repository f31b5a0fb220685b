"""The root Typer app: every command group registered (importing this module imports every command module)."""

import typer

from . import agent, audit, check, keys, manifest, rollout, server, tokens, tune, upgrade

app = typer.Typer(
    help="Preflight: validate, sign and audit vLLM launch configurations.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.command()(server.migrate)
app.command()(server.serve)
app.command(cls=check.CheckCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    check.check
)
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
