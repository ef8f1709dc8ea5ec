"""Regular expressions (ECMA and Python alike: digits, classes, alternation) that take exactly the decimal
strings of a range, so the OpenAPI document can say which `seconds` and `size` strings a loaded model takes
(a JSON Schema pattern cannot compare numbers). A value is written with 1 to `int_digits` digits before the
point (leading zeros allowed) and 0 to `frac_digits` after it, as `/v1/videos` reads it."""

from __future__ import annotations

import math
from fractions import Fraction


def decimal_range(lo: Fraction, hi: Fraction, int_digits: int, frac_digits: int = 0) -> str:
    """An unanchored group taking every decimal string whose value lies in [lo, hi] (a never-matching
    group when none does)."""
    alternatives = []
    for k in range(frac_digits + 1):  # k digits after the point: the string is an integer n / 10^k
        first, last = math.ceil(lo * 10**k), math.floor(hi * 10**k)
        for width in range(k + 1, k + int_digits + 1):  # every digit written, leading zeros included
            a, b = max(first, 0), min(last, 10**width - 1)
            if a <= b:
                alternatives += [
                    _render(digits, k) for digits in _same_width(str(a).zfill(width), str(b).zfill(width))
                ]
    return "(?:" + "|".join(alternatives or ["(?!)"]) + ")"


def _same_width(a: str, b: str) -> list[list[str]]:
    """Digit strings of a's width from a to b (a ≤ b), as sequences of one character class per digit."""
    if a == b:
        return [list(a)]
    if len(a) == 1:
        return [[f"[{a}-{b}]"]]
    if a[0] == b[0]:
        return [[a[0], *rest] for rest in _same_width(a[1:], b[1:])]
    n, head, tail = len(a) - 1, [], []
    start, end = int(a[0]), int(b[0])
    if a[1:] != "0" * n:  # a's first digit takes only the rest from a's
        head, start = [[a[0], *rest] for rest in _same_width(a[1:], "9" * n)], start + 1
    if b[1:] != "9" * n:
        tail, end = [[b[0], *rest] for rest in _same_width("0" * n, b[1:])], end - 1
    middle = [[f"[{start}-{end}]", *["[0-9]"] * n]] if start <= end else []
    return head + middle + tail


def _render(digits: list[str], k: int) -> str:
    whole, fraction = digits[: len(digits) - k], digits[len(digits) - k :]
    return "".join(whole) + ("\\." + "".join(fraction) if k else "")
