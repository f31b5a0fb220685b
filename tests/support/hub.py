"""A Hub-compatible stand-in on 127.0.0.1 (no internet): ``/{owner}/{name}/resolve/{revision}/{file}`` with byte
ranges and the ``X-Repo-Commit`` header, as the Hub serves files (huggingface_hub 2.4.0 file_download.py:1677 reads
that header); the file list of the top folder, ``/api/models/{owner}/{name}/tree/{revision}``, a JSON array of
``{"type": "file" | "directory", "oid", "size", "path"}`` paged by a ``Link: <…?cursor=N>; rel="next"`` header
(hf_api.py:4018-4031, utils/_pagination.py:68-69); and, for the hostile cases, answers a Hub would never give (``Hub.hostile``: file -> behaviour)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

REPO = "org/tiny"
COMMIT = "c0ffee" + "0" * 34  # what ``main`` resolves to


class Hub(http.server.BaseHTTPRequestHandler):
    repo: str = REPO  # the repository it serves
    files: dict[str, bytes] = {}
    # repository -> (HTTP status, X-Error-Code) the Hub answers for it: (401, "GatedRepo"), (404, "RepoNotFound")
    refused: dict[str, tuple[int, str]] = {}
    ranges: list[tuple[str, str | None]] = []
    requested: list[str] = []  # the paths asked for, in order
    commit: str | None = COMMIT
    revisions: set[str] = {"main", COMMIT}
    # file -> "slow" (no answer for 30 s), "drip" (an answer of no stated length, a byte every 0.5 s), "loop" (a
    # redirect to itself), "huge" (a 200 that ignores the range: 10^12 bytes announced)
    hostile: dict[str, str] = {}
    # the tree API (``/api/models/{repo}/tree/{revision}``, huggingface_hub 2.4.0 hf_api.py:4023): entries a page,
    # and the entries it lists instead of ``files``' when set (a hostile listing)
    page: int = 1000
    listing: list | dict | None = None
    elsewhere: str = ""  # an origin the next page's link names (empty: the stand-in's own, as a relative link)

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/api/"):
            self.requested.append(self.path)
            self._tree()
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
        name = m.group(3) if m else self.path
        self.ranges.append((self.path.rsplit("/", 1)[-1], self.headers.get("Range")))
        self.requested.append(self.path)
        how = self.hostile.get(name)
        if how and self._hostile(how):
            return
        if m and m.group(1) in self.refused:
            self._error(*self.refused[m.group(1)])
            return
        data = self.files.get(name) if m and m.group(1) == self.repo and m.group(2) in self.revisions else None
        if data is None:
            self._error(404, "EntryNotFound")
            return
        r = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        first, last = (int(r.group(1)), min(int(r.group(2)), len(data) - 1)) if r else (0, len(data) - 1)
        self.send_response(206 if r else 200)
        if r:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        if self.commit:
            self.send_header("X-Repo-Commit", self.commit)
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self.wfile.write(data[first : last + 1])

    def _tree(self) -> None:
        """The top folder's entries (``recursive=false``), ``page`` at a time, the next page in a Link header."""
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/?]+)(?:\?(.*))?", self.path)
        if not m or m.group(1) != self.repo or m.group(1) in self.refused:
            self._error(*self.refused.get(m.group(1) if m else "", (404, "RepoNotFound")))
            return
        if m.group(2) not in self.revisions:
            self._error(404, "RevisionNotFound")
            return
        entries = self.listing
        if entries is None:
            top = sorted({name.split("/")[0]: "/" in name for name in self.files}.items())
            entries = [
                {
                    "type": "directory" if folder else "file",
                    "oid": "0" * 40,
                    "size": len(self.files.get(n, b"")),
                    "path": n,
                }
                for n, folder in top
            ]
        at = re.search(r"cursor=(\d+)", m.group(3) or "")
        cursor = int(at.group(1)) if at else 0
        body = json.dumps(entries[cursor : cursor + self.page] if isinstance(entries, list) else entries).encode()
        self.send_response(200)
        if isinstance(entries, list) and cursor + self.page < len(entries):
            self.send_header(
                "Link", f'<{self.elsewhere}{self.path.split("?")[0]}?cursor={cursor + self.page}>; rel="next"'
            )
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _hostile(self, how: str) -> bool:
        if how == "slow":
            time.sleep(30)
            return True
        if how == "loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        if how == "drip":  # no length announced: read until the connection closes
            self.send_response(200)
            self.end_headers()
            for _ in range(60):
                self.wfile.write(b"{")
                self.wfile.flush()
                time.sleep(0.5)
            return True
        if how == "huge":  # a 200 that ignores the range and never ends
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            try:
                for _ in range(10**6):
                    self.wfile.write(b" " * 65536)
            except OSError:
                pass
            return True
        return False

    def log_message(self, *args):
        pass


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[tuple[type[Hub], str]]:
    """The stand-in serving ``files`` as ``org/tiny`` at ``main`` (= COMMIT); yields its handler class (to change
    what it serves, or read the ranges asked for) and its endpoint URL."""

    class Handler(Hub):
        ranges = []
        requested = []
        hostile = {}
        refused = {}
        listing = None
        page = 1000
        elsewhere = ""

    Handler.files = dict(files)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
