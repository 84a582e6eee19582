"""Kubernetes resource quantities (`1Gi`, `500M`, `1k`, `100`, `1e3`), the way upstream writes byte and request caps.

Upstream's `flowControl.maxBytes` / `maxRequests` are `resource.Quantity` values, so a file's `1Gi` must mean
1073741824 here too. The grammar is the API machinery's: a signed decimal number, then a binary suffix
(Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E) or a decimal exponent (`e3`, `E-2`). A YAML number is
taken as is. Values are rounded up to a whole number, as `Quantity.Value()` rounds.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")


def parse_quantity(value: object) -> int:
    """A non-negative whole number from a quantity; ValueError says why."""
    if isinstance(value, bool):
        raise ValueError("expected a quantity such as '1Gi' or '500', got a boolean")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite quantity, got {value!r}")
        amount = Fraction(value)
    elif isinstance(value, str):
        match = _QUANTITY.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"not a quantity: {value!r} (use e.g. '1Gi', '500M', '100')")
        number, exponent, suffix = match.groups()
        amount = Fraction(number)
        if exponent:
            amount *= Fraction(10) ** int(exponent[1:])
        elif suffix in _BINARY:
            amount *= _BINARY[suffix]
        else:
            amount *= _DECIMAL[suffix or ""]
    else:
        raise ValueError(f"expected a quantity such as '1Gi' or '500', got {value!r}")
    if amount < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return math.ceil(amount)
