"""One display-text check for every name (service/domain/text.py): control and invisible characters are refused,
printable text in any script passes."""

from __future__ import annotations

import pytest

from service.domain.text import display_text_problem

REFUSED = [
    "\u202e",
    "\u202a",
    "\u2066",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\u00ad",
    "\u0085",
    "\u2028",
    "\u2029",
    "\x07",
    "\x1b",
    "\x7f",
    "\ue000",
    "\u2800",  # the blank braille pattern: a reason of it looks empty
]


@pytest.mark.parametrize("ch", REFUSED)
def test_control_and_invisible_characters_are_refused_by_the_one_check(ch):
    problem = display_text_problem(f"gpu{ch}-01")
    assert problem is not None and f"U+{ord(ch):04X}" in problem and "at position 3" in problem


@pytest.mark.parametrize(
    "text",
    [
        "NVIDIA H100 80GB HBM3",
        "Llama-3.1-8B-Instruct",
        "équipe données",
        "機械学習-東京",
        "rack 12 🚀",
        "model-00001-of-00030.safetensors",
    ],
)
def test_printable_text_in_any_script_passes(text):
    assert display_text_problem(text) is None
