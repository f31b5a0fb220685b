"""Strings shown to people — names (nodes' labels, GPU names, manifest names, shard file names, token labels) and the
values printed in a node's command line (environment values, engine arguments) — must read as what they are.

Refused: Unicode category C ("other": Cc control characters — C0, DEL, C1 —, Cf format characters — the
bidirectional overrides and isolates U+202A..U+202E and U+2066..U+2069 that make ``abc‮gpj.exe`` display as
``abcexe.jpg``, the zero-width U+200B..U+200D, U+2060, U+FEFF, the soft hyphen —, Cs lone surrogates, Co private use,
Cn unassigned), the line and paragraph separators (Zl U+2028, Zp U+2029) and the letters and marks that draw nothing
(Hangul fillers, the combining grapheme joiner, variation selectors). A tab is allowed only where a caller
says so. Printable text in any script passes.

``display_text_problem`` is the one check; ``display_text`` raises ValueError for Pydantic validators (the 422 names
the field); ``escape_invisible`` (pages) and ``printable`` (terminals) escape what it refuses.
"""

from __future__ import annotations

import unicodedata

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# characters of other categories that draw nothing: the Hangul fillers (letters, Lo), the combining grapheme joiner
# and the variation selectors (Mn) — a name made of them looks empty or like another
INVISIBLE = frozenset(
    {0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)}
)  # and the blank braille pattern (So)


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in REFUSED_CATEGORIES or ord(ch) in INVISIBLE


def escape_invisible(text: str, keep: str = "") -> str:
    """``text`` for a page or a terminal: every character ``display_text_problem`` refuses written as ``\\uXXXX``
    (``\\U0010XXXX`` above the BMP), the characters of ``keep`` (e.g. a newline) left as they are."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        ch if ch in keep or not _hidden(ch) else (f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        for ch in text
    )


def printable(text: str, keep: str = "") -> str:
    """``text`` for a terminal: every character ``escape_invisible`` escapes — the control characters that drive a
    terminal (ESC, BEL, CSI) among them — written as Python writes it (``\\x1b``, ``\\u202e``, ``\\U000e0100``),
    the characters of ``keep`` (e.g. newlines and tabs) left as they are."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if ch in keep or not _hidden(ch) else ch.encode("unicode_escape").decode("ascii") for ch in text)


def display_text_problem(text: str, *, allow_tab: bool = False) -> str | None:
    """Why ``text`` cannot be shown as it is (None when it can): names the first refused character."""
    if text.isascii() and text.isprintable():
        return None
    for i, ch in enumerate(text):
        if allow_tab and ch == "\t":
            continue
        cat = unicodedata.category(ch)
        if cat in REFUSED_CATEGORIES or ord(ch) in INVISIBLE:
            name = unicodedata.name(ch, "") if cat != "Cs" else ""
            return (
                f"contains U+{ord(ch):04X}{' ' + name if name else ''} (Unicode category {cat}) at position {i}: "
                f"control, invisible formatting and bidirectional characters are refused (the text would "
                f"display differently from what it is)"
            )
    return None


def display_text(value: str) -> str:
    """A Pydantic ``AfterValidator``: ``value`` unchanged, or ValueError naming the refused character."""
    problem = display_text_problem(value)
    if problem:
        raise ValueError(problem)
    return value
