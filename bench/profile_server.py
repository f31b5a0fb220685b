"""Profile ``preflight serve --workers 2`` under the agent-fetch load with py-spy (a helper for the figures in
bench/README.md, not a benchmark).

    python -m bench.profile_server [--db pg|sqlite] [--nodes 200] [--conc 64] [--seconds 15] [--idle]

Seeds the fleet, runs wrk (as bench/agent_fetch.py does) and, meanwhile, ``py-spy record --format raw`` on each
worker; prints the top functions by inclusive and by self samples (service/ and library frames), summed over the
workers. ``--idle`` also counts threads that wait (locks, sockets): where wall time goes, not only CPU.
Needs py-spy (pip) and permission to ptrace the workers (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import pathlib
import shutil
import subprocess
import tempfile

from .agent_fetch import write_script
from .common import VENV_BIN, pg_database, preflight_server, seed_fleet, table


def top(raw_files: list[pathlib.Path], n: int = 25) -> tuple[list, list, int]:
    incl, self_, total = collections.Counter(), collections.Counter(), 0
    for f in raw_files:
        for line in f.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            c = int(count)
            total += c
            frames = stack.split(";")
            seen = set()
            for fr in frames:
                key = _short(fr)
                if key not in seen:
                    incl[key] += c
                    seen.add(key)
            self_[_short(frames[-1])] += c
    return incl.most_common(n), self_.most_common(n), total


def _short(frame: str) -> str:
    # py-spy raw frame: "function (path/to/file.py:line)"
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    path, _, _line = loc.rpartition(":")
    for marker in ("/site-packages/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{name}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", choices=["pg", "sqlite"], default="pg")
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--idle", action="store_true")
    args = ap.parse_args(argv)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="preflight-prof-"))
    try:
        ctx = pg_database() if args.db == "pg" else contextlib.nullcontext("sqlite")
        with ctx as db, preflight_server(db) as srv:
            fleet = asyncio.run(seed_fleet(srv.url, args.nodes, concurrency=8))
            write_script(tmp / "fetch.lua", fleet)
            load = subprocess.Popen(
                [
                    "wrk",
                    "-t",
                    "1",
                    "-c",
                    str(args.conc),
                    "-d",
                    f"{args.seconds + 3}s",
                    "--timeout",
                    "10s",
                    "-s",
                    str(tmp / "fetch.lua"),
                    srv.url,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            spies, outs = [], []
            for pid in srv.workers():
                out = tmp / f"w{pid}.raw"
                outs.append(out)
                cmd = [
                    str(VENV_BIN / "py-spy"),
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(args.seconds),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "-o",
                    str(out),
                ]
                if args.idle:
                    cmd.append("--idle")
                spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for s in spies:
                s.wait(timeout=args.seconds + 60)
            print(load.communicate(timeout=120)[0].strip().splitlines()[-3:])
        incl, self_, total = top([o for o in outs if o.exists()])
        print(f"py-spy samples: {total} ({'wall, idle included' if args.idle else 'CPU only'})")
        print(table(["inclusive: function", "%"], [[k, 100 * v / total] for k, v in incl]))
        print(table(["self: function", "%"], [[k, 100 * v / total] for k, v in self_]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
