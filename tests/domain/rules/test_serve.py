"""The ``vllm serve`` option-pair rules (service/domain/rules/serve.py): what validate_parsed_serve_args and the
tracing config refuse, each with a refused and an accepted launch, and the release each check starts in."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors, found

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


def _req(version: str | None = None, **args):
    req = request(LLAMA, count=1, **args)
    if version:
        req["vllm_version"] = version
    return req


def test_auto_tool_choice_needs_a_parser():
    (f,) = errors(_req(enable_auto_tool_choice=True), "serve_option_pair")
    assert f.message == "Error: --enable-auto-tool-choice requires --tool-call-parser"
    assert f.field == "engine_args.enable_auto_tool_choice"
    assert not errors(_req(enable_auto_tool_choice=True, tool_call_parser="llama3_json"), "serve_option_pair")
    # the oldest line read (0.6.6 entrypoints/openai/cli_args.py:265-268) refuses it too
    assert errors(_req("0.6.6", enable_auto_tool_choice=True), "serve_option_pair")


def test_log_outputs_need_log_requests():
    (f,) = errors(_req(enable_log_outputs=True), "serve_option_pair")
    assert f.remedy == {"enable_log_requests": True}
    assert not errors(_req(enable_log_outputs=True, enable_log_requests=True), "serve_option_pair")
    assert not errors(_req("0.10.2", enable_log_outputs=True), "serve_option_pair")  # 0.10 does not check


def test_sse_keep_alive_not_negative():
    (f,) = errors(_req(sse_keep_alive_interval=-1), "serve_option_pair")
    assert "--sse-keep-alive-interval must be a non-negative integer" in f.message
    assert f.remedy == {"sse_keep_alive_interval": 0}
    assert not errors(_req(sse_keep_alive_interval=15), "serve_option_pair")


def test_per_request_metrics_need_stats():
    (f,) = errors(_req(enable_per_request_metrics=True, disable_log_stats=True), "serve_option_pair")
    assert f.remedy == {"disable_log_stats": False}
    assert not errors(_req(enable_per_request_metrics=True), "serve_option_pair")


def test_detailed_traces_need_an_endpoint():
    (f,) = errors(_req(collect_detailed_traces=["worker"]), "traces_need_endpoint")
    assert f.message == "collect_detailed_traces requires `--otlp-traces-endpoint` to be set."
    ok = _req(collect_detailed_traces=["worker"], otlp_traces_endpoint="http://127.0.0.1:4317")
    assert not errors(ok, "traces_need_endpoint")
    assert not errors(_req("0.10.2", collect_detailed_traces="worker"), "traces_need_endpoint")


def test_grpc_port():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(llama, count=1, grpc_port=50051, grpc=True), "grpc_port")
    assert f.message.startswith("--grpc and --grpc-port are mutually exclusive.")
    req = request(llama, count=1, grpc_port=50051)
    assert not errors(req, "grpc_port")  # the node may set VLLM_USE_RUST_FRONTEND for itself: a warning
    assert [w.field for w in found(req, "grpc_port", severity="warning")] == ["env.VLLM_USE_RUST_FRONTEND"]
    req["env"] = {"VLLM_USE_RUST_FRONTEND": "0"}
    (f,) = errors(req, "grpc_port")
    assert f.message == "--grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve"
    req["env"] = {"VLLM_USE_RUST_FRONTEND": "1"}
    assert not errors(req, "grpc_port") and not found(req, "grpc_port", severity="warning")
    same = request(llama, count=1, grpc_port=8000)
    same["env"] = {"VLLM_USE_RUST_FRONTEND": "1"}
    (f,) = errors(same, "grpc_port")
    assert f.message == "--grpc-port must differ from --port when HTTP uses TCP"
