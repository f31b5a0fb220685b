"""Hostile YAML: every limit refuses with a YamlError naming the file (and line), in bounded time; and the rules
of Kubernetes' and Compose's variable expansion, the shell split and the located scalars."""

from __future__ import annotations

import pytest

from service.sources.compose import read as read_compose
from service.sources.containers import Located, LStr, compose_interpolate, k8s_expand
from service.sources.found import SourceError
from service.sources.helm import go_float
from service.sources.helm import read as read_helm_values
from service.sources.kube import read as read_kubernetes
from service.sources.read import read_source_text
from service.sources.yaml_load import MAX_BYTES, MAX_DEPTH, MAX_NODES, YamlError, char_offsets, load_all

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.timeout(10)
def test_billion_laughs_is_refused_without_expanding():
    with pytest.raises(YamlError) as e:
        read_kubernetes("laughs.yaml", "apiVersion: v1\nkind: Pod\n" + LAUGHS)
    assert e.value.file == "laughs.yaml" and str(MAX_NODES) in e.value.message and e.value.line is not None


@pytest.mark.timeout(10)
def test_deep_nesting_is_refused():
    with pytest.raises(YamlError) as e:
        load_all("deep.yaml", "a: " + "[" * 5000 + "]" * 5000)
    assert e.value.file == "deep.yaml" and f"deeper than {MAX_DEPTH}" in e.value.message


@pytest.mark.timeout(10)
def test_nesting_through_aliases_is_refused():
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH + 2))
    with pytest.raises(YamlError, match="aliases expanded"):
        load_all("alias-deep.yaml", text)


@pytest.mark.timeout(10)
def test_a_file_over_the_size_bound_is_refused():
    with pytest.raises(YamlError, match=f"larger than {MAX_BYTES}"):
        read_compose("big.yaml", "services: {}\n#" + "x" * MAX_BYTES)


@pytest.mark.timeout(10)
def test_binary_and_non_utf8_are_refused_with_their_line(tmp_path):
    """read.read_source_text is the one decoder of a deploy file, whatever its kind."""
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"services:\n  a: 1\n\x00\x01")
    with pytest.raises(SourceError) as e:
        read_source_text(path)
    assert (e.value.at.file, e.value.at.line) == (str(path), 3) and "binary" in e.value.reason
    path.write_bytes("services:\n  a: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SourceError) as e:
        read_source_text(path)
    assert e.value.at.line == 2 and "not UTF-8" in e.value.reason
    with pytest.raises(YamlError, match="binary"):
        read_helm_values("nul.yaml", "servingEngineSpec:\x00")
    path.write_bytes(b"\xef\xbb\xbfservices: {}\n")
    assert read_source_text(path) == "services: {}\n"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("services:\n  a: [1, 2\n", 3, "not YAML"),
        ("a: *nowhere\n", 1, "alias"),
        ("services:\n  vllm: {}\n  vllm: {}\n", 3, "duplicate key 'vllm'"),
        ("a: b: c\n", 1, "not YAML"),
    ],
)
def test_broken_yaml_is_a_located_error(text, line, what):
    with pytest.raises(YamlError) as e:
        read_compose("broken.yaml", text)
    assert e.value.file == "broken.yaml" and e.value.line == line and what in e.value.message
    assert str(e.value).startswith(f"broken.yaml:{line}:")


def test_merge_keys_are_applied():
    text = (
        "x-vllm: &base\n  image: vllm/vllm-openai:latest\n  command: [m, --max-model-len, '1024']\n"
        "services:\n  a:\n    <<: *base\n  b:\n    <<: *base\n    command: [n]\n"
    )
    a, b = read_compose("merge.yaml", text)
    assert a.argv == ["vllm", "serve", "m", "--max-model-len", "1024"] and b.argv == ["vllm", "serve", "n"]


def located(text: str) -> tuple[Located, LStr]:
    src, [doc] = load_all("t.yaml", text)
    return Located(src), LStr.of(src, doc.get("v"))


def test_kubernetes_expansion_rules():
    env = {"A": LStr.made("x", 0), "S": None}
    loc, s = located("v: '$(A)-$$(A)-$(B)-$(S)-$(A-$-$'\n")
    out = k8s_expand(s, env)
    # $(A) resolved, $$(A) literal (escaped), $(B) unknown and $(S) valueFrom left as written, an unclosed $( kept
    assert out.text.replace("\ue000", "$") == "x-$(A)-$(B)-$(S)-$(A-$-$"
    assert loc.span(out.offs[0]) == loc.span(s.offs[0])  # the value sits at its reference's ``$``


def test_compose_interpolation_rules():
    loc, s = located('v: "${M:-org/m} ${N-x} $$HOME ${TP} $TP"\n')
    assert compose_interpolate(s).text == "org/m x $HOME ${TP} $TP"


def test_a_compose_command_string_is_split_as_shell_words_and_keeps_their_places():
    import shlex

    command = "vllm serve ''a b'' \"c \\\"d\\\"\" e\\ f --x=$HOME --y=${Y}"
    text = f"services:\n  s:\n    image: x\n    command: '{command}'\n"
    (f,) = read_compose("c.yaml", text)
    assert f.argv == ["vllm", "serve", "a b", 'c "d"', "e f", "--x=$HOME", "--y=${Y}"]
    assert f.argv[:5] == shlex.split(command.replace("''", "'"))[:5]
    assert [str(w.at) for w in f.words[1:3]] == ["c.yaml:4:20", "c.yaml:4:26"]  # ``serve``, the quote
    assert [m.split(":")[0] for _, m in f.problems] == ["$HOME", "${Y}"]  # the host's, at `docker compose up`


def test_block_and_quoted_scalars_are_located_per_character():
    text = 'v: "a\n  b  c"\nw: |\n  x y\n  z\n'
    src, [doc] = load_all("t.yaml", text)
    offs = char_offsets(src, doc.get("v"))
    assert offs is not None and [src.at(o) for o in offs] == [(1, 5), (2, 1), (2, 3), (2, 4), (2, 5), (2, 6)]
    offs = char_offsets(src, doc.get("w"))
    assert offs is not None and src.at(offs[4]) == (5, 3)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.9, "0.9"), (4096.0, "4096"), (131072.0, "131072"), (1e6, "1e+06"), (1048576.0, "1.048576e+06")],
)
def test_go_prints_float64_as_helm_quotes_it(value, text):
    assert go_float(value) == text


def test_a_vllm_config_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path):
    """vLLM's own config files are read with PyYAML's safe_load (as vLLM reads them): the expanded size is counted
    from the event stream first, so eight levels of nine aliases (43 million nodes) are refused, not built."""
    from service.domain.launch_argv import MAX_CONFIG_NODES, expanded_nodes
    from service.sources.found import SourceError
    from service.sources.read import read_launches

    levels = ['  l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"  l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 8)]
    text = (
        "model: meta-llama/Llama-3.1-8B\nx-anchors:\n"
        + "\n".join(levels)
        + "\nkernel-config: {ir_op_priority: {rms_norm: *l7}}\n"
    )
    path = tmp_path / "vllm.yaml"
    path.write_text(text)
    with pytest.raises(ValueError):
        expanded_nodes(text)
    with pytest.raises(SourceError) as e:
        read_launches(path)
    assert str(MAX_CONFIG_NODES) in str(e.value)
    assert expanded_nodes("a: &a [1, 2]\nb: *a\n") == 9  # the mapping, key a, the list of 3, key b, its alias (3)
