"""The CLI: `preflight check` exit codes and JSON lines, on real configs and cases."""

from __future__ import annotations

import json
import pathlib

from typer.testing import CliRunner

from service.cli import app
from tests.support import MODELS, case_files, case_request, load_case, model_config

runner = CliRunner()


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_check_json_one_line_per_file_in_order(tmp_path):
    cases = [load_case(p) for p in case_files("handed")[:5]]
    files = [write(tmp_path, f"{i}.json", case_request(c)) for i, c in enumerate(cases)]
    r = runner.invoke(app, ["check", "--json", *map(str, files)])
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert len(lines) == 5
    assert all(l["verdict"] in ("accept", "warn", "reject") and l["argv"][:2] == ["vllm", "serve"] for l in lines)
    assert r.exit_code == (1 if any(l["verdict"] == "reject" for l in lines) else 0)


def test_check_reads_a_model_directory(tmp_path):
    req = {
        "model": {"path": str(MODELS / "microsoft__Phi-3-medium-4k-instruct")},
        "hardware": {"gpu": "a100-sxm4-80gb", "count": 4},
        "engine_args": {"tensor_parallel_size": 2},
    }
    r = runner.invoke(app, ["check", "--json", str(write(tmp_path, "ok.json", req))])
    out = json.loads(r.stdout.splitlines()[0])
    assert r.exit_code == 0 and out["verdict"] in ("accept", "warn")
    assert out["argv"][out["argv"].index("--tensor-parallel-size") + 1] == "2"


def test_check_reject_exit_1_and_readable_report(tmp_path):
    req = {
        "model": {"config": model_config("microsoft__Phi-3-medium-4k-instruct")},
        "hardware": {"gpu": "a100-sxm4-80gb", "count": 4},
        "engine_args": {"tensor_parallel_size": 4},
    }
    r = runner.invoke(app, ["check", str(write(tmp_path, "bad.json", req))])
    assert r.exit_code == 1 and "REJECT" in r.stdout and "tp_kv_heads" in r.stdout


def test_check_bad_input_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    unknown = write(
        tmp_path,
        "u.json",
        {"model": {"config": model_config("01-ai__Yi-34B")}, "hardware": {"gpu": "no-such-gpu"}, "surprise": 1},
    )
    r = runner.invoke(app, ["check", "--json", str(bad), str(unknown)])
    assert r.exit_code == 2
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [l["verdict"] for l in lines] == ["invalid", "invalid"]
    assert any("surprise" in e["field"] for e in lines[1]["errors"])


def test_production_refuses_insecure_defaults_and_a_missing_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_ENV", "production")
    r = runner.invoke(app, ["serve", "--no-migrate"])
    assert r.exit_code == 2 and "production mode refuses insecure defaults" in r.output
    monkeypatch.setenv("PREFLIGHT_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("PREFLIGHT_ADMIN_TOKEN", "a-production-admin-token-0123456789")
    monkeypatch.setenv("PREFLIGHT_SIGNING_KEY_DIR", str(tmp_path / "no-keys"))
    r = runner.invoke(app, ["serve", "--no-migrate"])
    assert r.exit_code == 2 and "refusing to start" in r.output and "keys init" in r.output


def test_agent_verify_needs_only_the_trust_file_and_keys_export_writes_one(tmp_path, monkeypatch):
    from service.signing import FRESHNESS_MEDIA_TYPE, KeyStore, freshness_claims, plan_claims, plan_digest

    monkeypatch.setenv("PREFLIGHT_DATA_DIR", str(tmp_path / "var"))
    store = KeyStore(tmp_path / "var" / "keys")
    trust = tmp_path / "trust.json"
    r = runner.invoke(app, ["keys", "export", "--out", str(trust)])
    assert r.exit_code == 0 and json.loads(trust.read_text()) == store.jwks()
    assert "d" not in json.loads(trust.read_text())["keys"][0]
    token = store.sign(
        plan_claims(
            issuer="preflight",
            audience="preflight-agent",
            node="gpu-01",
            plan_id="p-1",
            seq=4,
            manifest_digest="sha256:00",
            vllm_version="0.33.0",
            argv=["vllm", "serve", "s3://m"],
            env={},
            model_uri="s3://m",
        )
    )
    plan = tmp_path / "plan.jws"
    plan.write_text(token)
    fresh = tmp_path / "fresh.jws"
    fresh.write_text(
        store.sign(
            freshness_claims(
                issuer="preflight",
                audience="preflight-agent",
                node="gpu-01",
                plan_id="p-1",
                seq=4,
                digest=plan_digest(token),
                ttl=600,
                acked_seq=0,
            ),
            typ=FRESHNESS_MEDIA_TYPE,
        )
    )
    ok = runner.invoke(
        app, ["agent", "verify", str(plan), "--node", "gpu-01", "--trust", str(trust), "--freshness", str(fresh)]
    )
    assert ok.exit_code == 0 and json.loads(ok.stdout)["seq"] == 4
    other = tmp_path / "other.json"
    other.write_text(json.dumps(KeyStore(tmp_path / "other").jwks()))
    bad = runner.invoke(app, ["agent", "verify", str(plan), "--node", "gpu-01", "--trust", str(other)])
    assert bad.exit_code == 3 and "unknown_kid" in bad.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}')
    unusable = runner.invoke(app, ["agent", "verify", str(plan), "--node", "gpu-01", "--trust", str(broken)])
    assert unusable.exit_code == 2 and "not a usable JWKS" in unusable.stderr


def test_a_service_that_cannot_be_reached_is_one_line_and_status_69():
    import pathlib
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = str(pathlib.Path(sys.executable).parent / "preflight")
    for server in (f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"):
        r = subprocess.run(
            [exe, "tokens", "list", "--server", server, "--token", "x"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 69, r.stderr
        assert r.stderr.startswith("preflight: cannot reach the service") and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr
    assert "http:// or https://" in r.stderr
    first = subprocess.run(
        [exe, "tokens", "list", "--server", f"http://127.0.0.1:{port}", "--token", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert first.stderr.startswith(f"preflight: cannot reach the service at http://127.0.0.1:{port}: ")


def test_problems_are_printed_as_a_person_reads_them_and_never_raw_control_characters():
    import httpx

    from service.cli.common import problem_text

    r = httpx.Response(
        422,
        json={
            "type": "about:blank",
            "title": "Unprocessable",
            "status": 422,
            "detail": "rejected \x1b]0;pwned\x07",
            "errors": [{"field": "waves.0.percent", "message": "must rise"}],
            "findings": [{"rule": "tp_heads", "severity": "error", "message": "TP 3"}],
        },
    )
    assert problem_text(r) == ("rejected \\x1b]0;pwned\\x07\n  waves.0.percent: must rise\n  [tp_heads] TP 3")
    assert problem_text(httpx.Response(502, text="bad \u202egateway")) == "bad \\u202egateway"


def test_text_from_the_service_escapes_invisible_letters_and_selectors_too():
    """One check for what reaches a terminal (domain/text.py printable): besides control and format characters,
    the Hangul fillers and variation selectors that draw nothing are escaped, in problems and in rollout lines."""
    import httpx

    from service.cli.common import problem_text, safe

    r = httpx.Response(409, json={"detail": "node \u3164gpu-01\ufe0f is busy\u2028", "errors": []})
    assert problem_text(r) == "node \\u3164gpu-01\\ufe0f is busy\\u2028"
    assert safe("a\tb\nc\u115f\U000e0100" + "x" * 600, limit=8) == "a\\tb\\nc\\u115f\\U000e0100x…"


def test_the_plain_check_runs_without_the_command_line_and_says_the_same(tmp_path):
    """``preflight check [--json] FILE...`` skips building Typer's command line (check_files.plain_arguments): its
    output and exit status are the command's, file by file; anything else goes through the command line."""
    import subprocess
    import sys

    from service.cli.check_files import plain_arguments

    ok = write(tmp_path, "ok.json", case_request(load_case(case_files("handed")[0])))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    reject = write(
        tmp_path,
        "reject.json",
        {
            "model": {"config": model_config("microsoft__Phi-3-medium-4k-instruct")},
            "hardware": {"gpu": "a100-sxm4-80gb", "count": 4},
            "engine_args": {"tensor_parallel_size": 4},
        },
    )
    for args in (
        [str(ok)],
        [str(reject), "--json"],
        ["--json", str(ok), str(bad), str(tmp_path / "missing.json")],
        [str(bad)],
    ):
        plain = subprocess.run(
            [sys.executable, "-m", "service.cli", "check", *args], capture_output=True, text=True, timeout=120
        )
        typed = runner.invoke(app, ["check", *args])
        assert (plain.returncode, plain.stdout) == (typed.exit_code, typed.stdout), args
    opts = plain_arguments(["a.json", "--json"])
    assert opts is not None and (opts.files, opts.format) == ([pathlib.Path("a.json")], "json")
    for other in ([], ["--json"], ["--help"], ["-"], ["--"], ["a.json", "--jsn"]):
        assert plain_arguments(other) is None, other


def test_a_reader_that_goes_away_ends_check_quietly_with_status_1(tmp_path):
    """``preflight check ... | head``: as Click does for the command line, exit 1 and no traceback, on both paths."""
    import subprocess
    import sys

    ok = write(tmp_path, "ok.json", case_request(load_case(case_files("handed")[0])))
    files = [str(ok)] * 200  # far more than a pipe holds
    for args in (["check", *files], ["check", "--", *files]):
        with subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as p:
            assert p.stdout.read(100).startswith(b"== ")
            p.stdout.close()
            assert p.wait(120) == 1, args
            assert b"Traceback" not in p.stderr.read()


def _llama(util: float, environment: str = "production") -> dict:
    return {
        "model": {"config": model_config("meta-llama__Llama-3.1-8B-Instruct")},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 1},
        "environment": environment,
        "engine_args": {"gpu_memory_utilization": util, "max_model_len": 8192, "max_num_seqs": 32},
    }


def test_check_policy_and_strict(tmp_path):
    warned = str(write(tmp_path, "warned.json", _llama(0.93)))
    refused = str(write(tmp_path, "refused.json", _llama(0.97)))
    r = runner.invoke(app, ["check", "--json", warned])
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "warn"
    assert json.loads(r.stdout)["policy"]["name"] == "default"
    assert runner.invoke(app, ["check", "--strict", warned]).exit_code == 1
    assert runner.invoke(app, ["check", refused]).exit_code == 1
    lenient = tmp_path / "lenient.toml"
    lenient.write_text('name = "lenient"\n[production]\nutil_too_high = "off"\n')
    r = runner.invoke(app, ["check", "--json", "--strict", "--policy", str(lenient), refused])
    assert r.exit_code == 0, r.stdout
    assert json.loads(r.stdout)["verdict"] == "accept" and json.loads(r.stdout)["policy"]["name"] == "lenient"


def test_check_bad_policy_exit_2_naming_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[production]\ntp_heads_divisible = "off"\n')
    r = runner.invoke(app, ["check", "--policy", str(bad), str(write(tmp_path, "ok.json", _llama(0.9)))])
    assert r.exit_code == 2
    assert f"policy file {bad}: production.tp_heads_divisible: is one of vLLM's own start-up checks" in r.stdout
