"""The agent's client and state file (service/agent/client.py): a slow or compressed answer is refused, a state
file that does not parse is corrupt, and a state set aside names why and never overwrites."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from service.agent.client import AgentClient, AgentState, ResponseTooLarge, StateCorrupt


def test_set_aside_names_why_and_never_overwrites(tmp_path):
    state = tmp_path / "state.json"
    names = []
    for why in ("reset", "reset", "corrupt"):
        state.write_text("{}")
        names.append(AgentState(path=state).set_aside(why).name)
    assert re.fullmatch(r"state\.json\.reset-\d{8}T\d{6}Z", names[0])
    assert names[1] != names[0] and names[1].startswith("state.json.reset-")
    assert names[2].startswith("state.json.corrupt-")
    assert len(list(tmp_path.iterdir())) == 3


def test_a_server_that_drips_bytes_is_unreachable_not_waited_on():
    def drip():
        for _ in range(50):
            time.sleep(0.05)
            yield b"x"

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=drip()))
    client = AgentClient("http://service", "n1", "t", transport=transport, timeout=0.1)
    with pytest.raises(httpx.ReadTimeout):
        client.fetch()


def test_a_compressed_answer_is_refused_before_it_is_expanded():
    import gzip

    bomb = gzip.compress(b"\0" * (8 << 20))
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=bomb, headers={"Content-Encoding": "gzip"}))
    with pytest.raises(ResponseTooLarge):
        AgentClient("http://service", "n1", "t", transport=transport).fetch()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_verified_at_is_a_corrupt_state(tmp_path, value):
    path = tmp_path / "state.json"
    path.write_text(f'{{"last_seq": 1, "verified_at": {value}}}')
    with pytest.raises(StateCorrupt):
        AgentState.load(path)


@pytest.mark.parametrize("etag", ['"\u00e9"', '"a\nb"', '"p-1"\x7f'])
def test_an_etag_that_is_no_header_value_is_not_sent(etag):
    # the ETag comes from the state file or a server's header; one that HTTP cannot carry made every fetch raise
    # (UnicodeEncodeError out of the boot, or a protocol error read as "the service is unreachable")
    seen = []
    transport = httpx.MockTransport(
        lambda req: (seen.append(req.headers.get("If-None-Match")), httpx.Response(200, content=iter([b"plan"])))[1]
    )
    client = AgentClient("http://service", "n1", "t", transport=transport)
    assert client.fetch(etag).status_code == 200 and seen == [None]
    assert client.fetch('"p-1"').status_code == 200 and seen[-1] == '"p-1"'
