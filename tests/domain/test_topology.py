"""Multi-node topology (pure): groups, ranks, roles and each node's own argv, parsed back with the release's parser
semantics."""

from __future__ import annotations

import pytest

from service.domain.errors import DomainError
from service.domain.render import parse_argv
from service.domain.topology import node_arguments, node_argv, plan_topology
from service.domain.versions import resolve_version

LINE = resolve_version("0.33.0")[1]
BASE = ["vllm", "serve", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "16", "--max-model-len", "32768"]


def argvs(nodes, tp, pp=1, dp=1, gpus=8, line=LINE, addresses=None):
    topo = plan_topology(nodes, gpus, tp, pp, dp, line)
    out = {}
    for n in nodes:
        p = topo.placements[n]
        head_addr = (addresses or {}).get(p.head, f"10.0.0.{nodes.index(p.head) + 1}")
        out[n] = node_argv(BASE, node_arguments(topo, p, line, head_address=head_addr, tp=tp, pp=pp, dp=dp), line)
    return topo, out


def test_tp16_over_two_8_gpu_nodes_gives_two_different_commands():
    topo, out = argvs(["h-a", "h-b"], tp=16)
    assert topo.form == "nnodes" and topo.groups == (("h-a", "h-b"),)
    assert topo.placements["h-a"].role == "head" and topo.placements["h-b"].role == "worker"
    a, b = out["h-a"], out["h-b"]
    assert a != b and "--headless" in b and "--headless" not in a
    for argv, rank in ((a, 0), (b, 1)):
        _, parsed = parse_argv(argv, LINE)
        assert parsed["nnodes"] == 2 and parsed["node_rank"] == rank and parsed["master_addr"] == "10.0.0.1"
        assert parsed["tensor_parallel_size"] == 16


def test_four_nodes_at_tp16_form_two_groups():
    topo, out = argvs(["n1", "n2", "n3", "n4"], tp=16)
    assert topo.groups == (("n1", "n2"), ("n3", "n4"))
    assert [topo.placements[n].rank for n in ("n1", "n2", "n3", "n4")] == [0, 1, 0, 1]
    assert parse_argv(out["n4"], LINE)[1]["master_addr"] == "10.0.0.3"


def test_tp8_pp2_and_dp4_tp4_span_two_nodes():
    topo, _ = argvs(["a", "b"], tp=8, pp=2)
    assert topo.nodes_per_instance == 2 and topo.local_world == 8
    topo, out = argvs(["a", "b"], tp=4, dp=4)
    assert topo.nodes_per_instance == 2 and parse_argv(out["b"], LINE)[1]["node_rank"] == 1


def test_replicas_of_a_one_node_launch_get_the_same_argv_without_nnodes():
    topo, out = argvs(["a", "b"], tp=8)
    assert topo.form == "replicas" and out["a"] == out["b"] == BASE
    assert all(p.role == "replica" for p in topo.placements.values())


def test_node_count_not_a_multiple_of_the_instance_size_names_the_numbers():
    with pytest.raises(DomainError) as e:
        plan_topology(["a", "b", "c"], 8, 16, 1, 1, LINE)
    assert e.value.field == "nodes" and "3 node(s)" in e.value.message and "instances of 2" in e.value.message


def test_world_that_does_not_divide_over_its_nodes_is_refused():
    assert plan_topology(["a", "b"], 8, 12, 1, 1, LINE).local_world == 6  # 12 = 6 + 6 over two nodes
    with pytest.raises(DomainError) as e:
        plan_topology(["a", "b", "c"], 8, 20, 1, 1, LINE)  # 20 needs 3 nodes of 8 and 3 does not divide 20
    assert "World size 20" in e.value.message and "3 nodes" in e.value.message


def test_ray_backend_multi_node_is_refused_with_the_reason():
    with pytest.raises(DomainError) as e:
        plan_topology(["a", "b"], 8, 16, 1, 1, LINE, backend="ray")
    assert "Ray cluster" in e.value.message


def test_older_line_without_nnodes_uses_the_data_parallel_form_or_refuses():
    old = resolve_version("0.10.2")[1]
    topo, out = argvs(["a", "b"], tp=4, dp=4, line=old)
    assert topo.form == "data_parallel"
    _, parsed = parse_argv(out["b"], old)
    assert parsed["data_parallel_size_local"] == 2 and parsed["data_parallel_start_rank"] == 2
    assert parsed["headless"] is True and parsed["data_parallel_address"] == "10.0.0.1"
    with pytest.raises(DomainError):
        plan_topology(["a", "b"], 8, 16, 1, 1, old)


def test_the_data_parallel_head_takes_no_start_rank():
    # with a start rank and without --headless vLLM would infer hybrid load balancing (arg_utils.py:2486-2491)
    old = resolve_version("0.10.2")[1]
    _, out = argvs(["a", "b"], tp=4, dp=4, line=old)
    _, head = parse_argv(out["a"], old)
    assert "data_parallel_start_rank" not in head and "headless" not in head
    assert head["data_parallel_size_local"] == 2 and head["data_parallel_address"] == "10.0.0.1"


def test_group_digest_is_deterministic_and_covers_every_member():
    from service.domain.topology import group_digest

    content = {
        "plan": "p",
        "members": [
            {"node": "a", "rank": 0, "argv": ["vllm", "serve", "m"]},
            {"node": "b", "rank": 1, "argv": ["vllm", "serve", "m", "--headless"]},
        ],
    }
    again = {"members": [dict(reversed(list(m.items()))) for m in content["members"]], "plan": "p"}
    assert group_digest(content) == group_digest(again)
    changed = {**content, "members": [content["members"][0], {**content["members"][1], "rank": 2}]}
    assert group_digest(changed) != group_digest(content)


@pytest.mark.parametrize(
    "value,ok",
    [
        ("10.0.0.1", True),
        ("fd00::1", True),
        ("gpu-1.example.com", True),
        ("gpu-1.example.com.", True),
        ("gpu-1.EXAMPLE.com", True),
        ("169.255.0.1", True),
        ("fd00::127.0.0.1", True),
        ("localhost", False),
        ("LOCALHOST", False),
        ("localhost.", False),
        ("gpu-1.localhost", False),
        ("gpu-1.LocalHost.", False),
        ("localhost.localdomain", False),
        ("ip6-localhost", False),
        ("localhost4.localdomain4", False),  # Red Hat's /etc/hosts: 127.0.0.1
        ("LOCALHOST6.localdomain6.", False),  # Red Hat's /etc/hosts: ::1
        ("0.1.2.3", False),  # 0.0.0.0/8 is "this network" (RFC 1122 3.2.1.3): a source, never a destination
        ("::ffff:0.9.9.9", False),
        ("127.0.0.1", False),
        ("127.255.0.9", False),
        ("::1", False),
        ("::", False),
        ("::ffff:127.0.0.1", False),
        ("::127.0.0.1", False),
        ("2002:7f00:1::", False),
        ("0x7f000001", False),
        ("0x7F.0.0.1", False),
        ("0177.0.0.1", False),
        ("169.254.1.1", False),
        ("fe80::1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("-x", False),
        ("a_b", False),
        ("1.2.3", False),
        ("x" * 64, False),
        ("a." * 127 + "a", False),
        ("", False),
    ],
)
def test_address_problem(value, ok):
    from service.domain.topology import address_problem

    assert (address_problem(value) is None) is ok
