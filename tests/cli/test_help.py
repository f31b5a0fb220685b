"""The CLI's help text: paragraphs, and one line per agent command."""

from __future__ import annotations

from typer.testing import CliRunner


def test_every_command_help_is_paragraphs_and_the_agent_lists_one_line_each():
    import typer

    from service.cli import app

    group = typer.main.get_command(app)

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    seen = 0
    for path, cmd in walk(group, []):
        seen += 1
        paragraphs = (cmd.help or "").split("\n\n")
        assert all("\n" not in p for p in paragraphs), (path, cmd.help)
        if path[0] == "agent":
            assert len(paragraphs[0]) <= 100, (path, paragraphs[0])
    assert seen >= 20
    out = CliRunner().invoke(app, ["agent", "--help"])
    assert out.exit_code == 0 and "Boot this node's current plan: verify it, check the node" in out.output
