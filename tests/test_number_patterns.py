"""server.number_patterns: a range's pattern takes exactly the decimal strings whose value lies in it,
checked against exact fractions on random strings and on the bounds written every way."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from server.number_patterns import decimal_range

SYNTAX = re.compile(r"[0-9]{1,4}(\.[0-9]{1,6})?")  # what /v1/videos reads as seconds


@pytest.mark.parametrize(
    "lo, hi",
    [(Fraction(5, 16), Fraction(33, 16)), (Fraction(5, 16), Fraction(9, 16)),
     (Fraction(1, 3), Fraction(7, 3)), (Fraction(1), Fraction(3600)), (Fraction(33, 30), Fraction(33, 30))],
)  # fmt: skip
def test_a_range_pattern_takes_exactly_the_values_inside(lo, hi):
    pattern, rng = re.compile(f"^{decimal_range(lo, hi, 4, 6)}$"), random.Random(0)
    texts = ["0", "0.0", "3600", "1.1", "01.10", "2.0625", "2.062500", "2.0626", "0.3125", "0.3124"]
    for _ in range(20000):
        whole = (
            str(rng.randint(0, 3))
            if rng.random() < 0.7
            else str(rng.randint(0, 9999)).zfill(rng.randint(1, 4))
        )
        fraction = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 6)))
        texts.append(whole + (f".{fraction}" if fraction else ""))
    for text in texts:
        inside = SYNTAX.fullmatch(text) is not None and lo <= Fraction(text) <= hi
        assert bool(pattern.fullmatch(text)) == inside, (lo, hi, text)


def test_integer_sides_with_leading_zeros():
    side = decimal_range(Fraction(16), Fraction(256), 5)
    pattern = re.compile(f"^{side}x{side}$")
    for w in ("16", "0016", "00016", "256", "100", "15", "257", "000016", "0", "99999"):
        inside = len(w) <= 5 and 16 <= int(w) <= 256
        assert bool(pattern.fullmatch(f"{w}x64")) == inside, w
    assert (
        re.fullmatch(decimal_range(Fraction(3), Fraction(2), 4), "2") is None
    )  # an empty range takes nothing
