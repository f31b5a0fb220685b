"""The production code-loading gate (service/domain/code_policy.py): every option that makes a node import code is
found, whatever form its value takes."""

from __future__ import annotations

import pytest

from service.domain import versions
from service.domain.code_policy import code_loading
from service.domain.engine_args import parse_engine_args


def loading(raw, version="0.33.0"):
    return code_loading(parse_engine_args(raw, versions.resolve_version(version)[1]))


def test_model_class_overrides_registers_a_class_by_its_import_path():
    # vLLM registers each {architecture: "module:Class"} in its model registry and imports it to build the model
    found = loading({"model_class_overrides": {"LlamaForCausalLM": "evil.mod:Model"}})
    assert [f for f, _ in found] == ["engine_args.model_class_overrides"]
    assert loading({"model_class_overrides": {}}) == []


@pytest.mark.parametrize("version,mode", [("0.33.0", {"mode": 1}), ("0.9.2", {"level": 1})])
def test_a_compile_backend_given_as_an_import_path_loads_code(version, mode):
    # in the DYNAMO modes vLLM resolves a backend that torch has not registered with resolve_obj_by_qualname
    found = loading({"compilation_config": {**mode, "backend": "evil.mod.fn"}}, version)
    assert found == [
        (
            "engine_args.compilation_config",
            "compilation_config.backend 'evil.mod.fn' is an import path: it loads code on the node",
        )
    ]
    assert loading({"compilation_config": {**mode, "backend": "inductor"}}, version) == []


@pytest.mark.parametrize("version", ["0.6.6", "0.7.3"])
def test_json_given_as_the_text_of_a_string_option_is_searched(version):
    # before 0.9 --compilation-config is a plain string that vLLM parses as JSON itself (CompilationConfig.from_cli),
    # whose inductor_passes it imports
    raw = {"compilation_config": '{"level": 3, "inductor_passes": {"p": "evil.mod.fn"}}'}
    assert loading(raw, version) == [
        (
            "engine_args.compilation_config",
            "compilation_config.inductor_passes {'p': 'evil.mod.fn'} loads code on the node",
        )
    ]
    assert loading({"compilation_config": "3"}, version) == []
    assert loading({"compilation_config": '{"level": 3}'}, version) == []


@pytest.mark.parametrize(
    "version,raw,field",
    [
        ("0.32.0", {"log_config_file": "/tmp/log.json"}, "engine_args.log_config_file"),
        ("0.33.0", {"logging_config": {"pylogging_config_file": "/tmp/log.json"}}, "engine_args.logging_config"),
    ],
)
def test_a_logging_config_file_loads_code(version, raw, field):
    # logging.config.dictConfig imports what the file names ("()": "module.factory", "class": ...) and calls it; the
    # env spelling, VLLM_LOGGING_CONFIG_PATH, is refused by env_policy for the same reason
    assert [f for f, _ in loading(raw, version)] == [field]


def test_code_loading_names_the_list_item_that_loads():
    from service.domain import versions
    from service.domain.code_policy import code_loading
    from service.domain.engine_args import parse_engine_args

    raw = {
        "kv_transfer_config": {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                    {"kv_connector": "X", "kv_role": "kv_both", "kv_connector_module_path": "evil.mod"},
                ]
            },
        }
    }
    found = code_loading(parse_engine_args(raw, versions.resolve_version("0.33.0")[1]))
    assert found == [
        (
            "engine_args.kv_transfer_config",
            "kv_transfer_config.kv_connector_extra_config.connectors[1]"
            ".kv_connector_module_path 'evil.mod' loads code on the node",
        )
    ]
