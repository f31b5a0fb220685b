"""The agent's own files — its token, its state, its trust root, its copy of the audit checkpoint — read as hostile
input: the files it writes never through a symlink (``O_NOFOLLOW``: a link planted where the agent keeps a file could
make it read, and report or send, a file it was not given; the token file and the trust root, which an operator
provisions and Kubernetes mounts as links, are followed — see ``read_file``), only a regular file (a FIFO or a device never blocks the agent:
``O_NONBLOCK``), and never more than a bound. The agent writes these files atomically (a temporary file renamed
into place, service/agent/trust.py ``write_text_atomic``), which replaces a link rather than writing through it;
reading follows the same rule.

Tokens the agent reads from a file must look like the ones the service issues (service/services/tokens.py
``new_secret``: ``pf_`` and 43 characters of the URL-safe base64 alphabet), so a file holding anything else (a
password file, a key, a truncated copy) is never sent as a bearer token.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import stat

TOKEN_PREFIX = "pf_"
TOKEN_RE = re.compile(r"pf_[A-Za-z0-9_-]{43}")  # "pf_" + secrets.token_urlsafe(32)
MAX_TOKEN_FILE = 4096


class UnsafeFile(OSError):
    """The path is a symlink, not a regular file, or larger than it may be (an OSError: callers that already handle
    an unreadable file handle this one too)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.strerror = message


def read_file(path: pathlib.Path | str, *, limit: int, what: str = "file", follow: bool = False) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``). Raises FileNotFoundError when it does not
    exist, UnsafeFile for a symlink (unless ``follow``), anything but a regular file or more than ``limit`` bytes,
    and OSError for the rest (permission denied, …).

    ``follow``: for the inputs an operator provisions and the agent only reads — the token file and the trust root —,
    which Kubernetes mounts from a Secret or ConfigMap as symlinks into ``..data/``: the link is followed, and the
    file it ends at must still be a regular file within the bound (and a token must still look like ours, so no other
    file is ever sent as one). The files the agent writes (its state, its checkpoint copy) are never read through a
    link."""
    flags = os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW on a symlink (EMLINK on the BSDs)
            raise UnsafeFile(f"{what} {path} is a symlink: refused (name the file itself, not a link to it)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise UnsafeFile(f"{what} {path} is {kind}: refused")
        if st.st_size > limit:
            raise UnsafeFile(f"{what} {path} holds {st.st_size} bytes, more than the {limit} it may hold")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # grew after fstat
            raise UnsafeFile(f"{what} {path} holds more than the {limit} bytes it may hold")
        return data
    finally:
        os.close(fd)


def token_problem(text: str) -> str | None:
    """Why ``text`` (stripped) is not a token the service issues (None when it is one)."""
    if not text:
        return "is empty (run `preflight agent register`)"
    if not TOKEN_RE.fullmatch(text):
        return f"does not hold a Preflight token ({TOKEN_PREFIX} followed by 43 characters of A-Z, a-z, 0-9, _ and -)"
    return None


def read_token_file(path: pathlib.Path | str) -> str:
    """The token in ``path`` (as ``preflight agent register`` wrote it, or a mounted Secret: a link is followed).
    Raises FileNotFoundError, UnsafeFile (not a regular file, too large, not ASCII, or not a token of ours) or
    OSError."""
    raw = read_file(path, limit=MAX_TOKEN_FILE, what="the token file", follow=True)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UnsafeFile(f"the token file {path} does not hold an ASCII token") from None
    problem = token_problem(text)
    if problem:
        raise UnsafeFile(f"the token file {path} {problem}")
    return text
