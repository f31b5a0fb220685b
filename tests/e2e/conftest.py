"""Every test here starts real processes (the service under uvicorn, the agent CLI, a stand-in vllm): each carries
the ``e2e`` marker (``-m 'not e2e'`` leaves them out)."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from service.clock import SYSTEM
from tests.support.live import ThreadServer, free_port, start_server

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def servers(db_url, tmp_path):
    """``servers(n)``: n services on one database and data directory, their URLs. One runs in a thread of the test
    process (on ``clock``, the machine's by default); two or more are separate processes (what those tests are
    about)."""
    procs, threads, urls = [], [], []
    data = tmp_path / "var"
    data.mkdir()

    def start(n=1, clock=SYSTEM):
        for _ in range(n):
            port = free_port()
            if n == 1:
                threads.append(ThreadServer(db_url, data, port, clock).start())
            else:
                procs.append(start_server(db_url, data, port))
            urls.append(f"http://127.0.0.1:{port}")
        return urls

    yield start
    for t in threads:
        t.stop()
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
