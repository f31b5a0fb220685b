"""service/domain/jsoncheck.py: the fast walk (no paths) and the walk that names the path agree on every value —
the fast one may only send more values to the named walk, never let one through that the named walk refuses."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.domain.jsoncheck import MAX_DEPTH, MAX_SAFE_INT, JsonValueError, _check_named, check_json

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=8),  # NUL and lone surrogates
)
values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=4), kids, max_size=4)),
    max_leaves=30,
)


def outcome(fn, value):
    try:
        fn(value, "config")
    except JsonValueError as e:
        return str(e)
    return None


@settings(max_examples=400, deadline=None)
@given(values)
def test_fast_walk_and_named_walk_agree(value):
    assert outcome(check_json, value) == outcome(_check_named, value)


@pytest.mark.parametrize(
    "value, message",
    [
        ({"a": [1, {"b": 2**53}]}, "config.a[1].b: integer 9007199254740992 is outside ±2^53"),
        ({"a": math.inf}, "config.a: inf is not a finite number"),
        ({"a": ["x\x00"]}, "config.a[0]: contains a NUL character"),
        ({"a\udc00": 1}, "config: key 'a\\udc00' is not a plain string"),
        ({"a": "\udc00"}, "config.a: contains a lone surrogate (not valid Unicode text)"),
    ],
)
def test_the_first_problem_is_named_with_its_path(value, message):
    with pytest.raises(JsonValueError) as e:
        check_json(value, "config")
    assert str(e.value) == message


def test_nesting_limit_and_safe_integers_at_the_edges():
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    check_json(deep)  # the leaf sits at depth MAX_DEPTH: allowed
    with pytest.raises(JsonValueError, match="nested deeper than 64 levels"):
        check_json([deep])
    check_json({"x": [MAX_SAFE_INT, -MAX_SAFE_INT, {}]})
    with pytest.raises(JsonValueError, match="outside"):
        check_json({"x": -MAX_SAFE_INT - 1})
    check_json([[] for _ in range(3)], depth=MAX_DEPTH - 1)  # empty containers at the limit pass
