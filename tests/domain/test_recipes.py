"""Known-good launches written from public vLLM recipes and docs (vllm-project/recipes, docs.vllm.ai serving
guides): each must pass (no error) on vLLM 0.33 — a false reject costs more trust than a missed check."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.recipes import RECIPES


@pytest.mark.parametrize("rid,model,hw,nodes,args", RECIPES, ids=[r[0] for r in RECIPES])
def test_recipe_launch_is_not_refused(rid, model, hw, nodes, args):
    req = request(model, gpu=hw[0], count=hw[1], nodes=nodes, environment="benchmark")
    req["engine_args"] = args
    req["model"]["uri"] = "org/" + model.split("__", 1)[1]
    result = validate(LaunchRequest.model_validate(req), alternatives=False)
    errors = [(f.rule, f.message[:200]) for f in result.findings if f.severity.value == "error"]
    assert errors == [], errors


def test_there_are_30_recipes():
    assert len(RECIPES) >= 30
