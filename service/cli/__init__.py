"""The ``preflight`` command line (Typer): serve, migrate, check, manifest push, agent run/verify, keys, audit,
rollouts, tuning, tokens and upgrade-check — one module per group, the root app in root.py (``service.cli.app``,
built on first use). Each module imports what its commands use when they run, so ``preflight check`` and the agent
load neither httpx (check) nor the service's web and database stack, and the plain form of ``check`` (files and
``--json``) runs without building the command line at all. The command modules keep their annotations evaluated
(no ``from __future__ import annotations``): Typer reads every command's signature at each start, and string
annotations would be evaluated then, for all 40."""

from __future__ import annotations

import importlib
import sys

MODULES = (
    "agent",
    "audit",
    "check",
    "check_files",
    "common",
    "keys",
    "manifest",
    "rollout",
    "root",
    "server",
    "tokens",
    "tune",
    "upgrade",
)


def __getattr__(name: str):
    if name == "app":
        return importlib.import_module(f"{__name__}.root").app
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unreachable(e: Exception) -> bool:
    """Whether ``e`` says the service cannot be reached (httpx is imported only by commands that call it: an
    exception of a command that never imported it is not one)."""
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(e, (httpx.TransportError, httpx.InvalidURL))


def _say_unreachable(e: Exception) -> None:
    import typer

    from .common import printable

    httpx = sys.modules["httpx"]
    reason = str(e) or e.__class__.__name__
    hint = " (give the address with http:// or https://)" if isinstance(e, httpx.UnsupportedProtocol) else ""
    where = ""
    if isinstance(e, httpx.TransportError):  # an InvalidURL carries no request
        try:
            u = e.request.url
            where = f" at {u.scheme}://{u.netloc.decode('ascii', 'replace')}"
        except (AttributeError, RuntimeError):  # no request was built (an unusable URL)
            pass
    keep = "\n\t"
    typer.echo(
        f"preflight: cannot reach the service{printable(where, keep)}: {printable(reason, keep)}{hint}", err=True
    )


def _plain_check(opts) -> int:
    """``run_check`` with the command line's handling of a reader that went away (``| head``): exit 1, quietly."""
    import os

    from .check_files import run_check

    try:
        code = run_check(opts)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    return code


def main() -> None:
    """The ``preflight`` command: the CLI, with a service that cannot be reached said in one line (not a
    traceback) and exit status 69 (EX_UNAVAILABLE)."""
    if sys.argv[1:2] == ["check"]:
        from .check_files import plain_arguments

        plain = plain_arguments(sys.argv[2:])
        if plain is not None:
            sys.exit(_plain_check(plain))
    from .root import app

    try:
        app()
    except Exception as e:
        if not _unreachable(e):
            raise
        _say_unreachable(e)
        sys.exit(69)
