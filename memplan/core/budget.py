"""Budget: the one grammar every entry point (API, backend, every CLI command) parses.

A budget is absolute bytes ("2GiB", "512 MB", 2e9) or a share of the unplanned peak
("60%", or a plain number up to 1: 0.6; so 1 is 100%, not one byte: "1 B" is). The
unplanned peak is the step's as written: the keep-all schedule's, with what the model's
own activation checkpointing recomputes recomputed (solvers.baselines.as_written; for
the literature's graphs, the reference order's P0). Rounding, documented once:

- a size is floored to whole bytes from its exact value: "1.001 KB" is 1001 bytes and
  1234.9 is 1234; but a plain number above 1 and under 1 KiB that is not whole (3.5, "2.5")
  is refused: no one means 3.5 bytes, and it reads as a size or a share with its unit
  left out;
- a share is rounded up from the exact product, as the literature's protocol does
  (B = ceil(m * P0)): "29%" of 100 bytes is 29, "50%" of 1001 bytes is 501.

No torch here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from memplan.core.errors import BudgetError
from memplan.core.units import format_bytes

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z%]*)\s*$")
# The most bytes a budget may name: allocators and torch count device memory in int64, and
# a budget anywhere near it is a typo. A share is bounded by the same number.
MAX_BUDGET_BYTES = 2**63 - 1
# A numeral beyond 10**+-_MAX_EXPONENT is no budget either way (too large, or under a byte);
# it is clamped before its exact value is built, which for 1e-999999999 would take minutes.
_MAX_EXPONENT = 20
_HINT = "use bytes (2e9), a size ('2GiB') or a share ('60%' or 0.6)"


@dataclass(frozen=True)
class Budget:
    """A peak-memory budget: absolute bytes, or a share of the unplanned peak.

    Both are exact so that float rounding never costs a byte: `fraction` is stored as a
    Fraction (a float given for it is read as the decimal it prints as, see _as_fraction).
    Bytes are 1 to MAX_BUDGET_BYTES. A share is at most MAX_BUDGET_BYTES and at least
    1 / MAX_BUDGET_BYTES: below that it is 0 bytes of any peak a device could have.
    """

    bytes: int | None = None
    fraction: Fraction | float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise BudgetError("a Budget has exactly one of bytes or fraction")
        if self.bytes is not None:
            if self.bytes <= 0:
                raise BudgetError(f"budget must be positive, got {_brief(self.bytes)} bytes")
            if self.bytes > MAX_BUDGET_BYTES:
                raise BudgetError(
                    f"budget of {_brief(self.bytes)} bytes is too large: at most 2**63 - 1 bytes"
                )
            return
        share = _as_fraction(self.fraction)
        if share <= 0:
            raise BudgetError(f"budget fraction must be positive, got {self.fraction}")
        _check_share(share, f"fraction {_brief(share)}")
        object.__setattr__(self, "fraction", share)  # frozen: store the exact value

    @classmethod
    def parse(cls, value: Budget | str | float | int) -> Budget:
        """Accept "6GiB", "512 MB", 6e9, 123456, "60%" or a plain number up to 1 (0.6):
        a share of the unplanned peak. A plain number above 1 is bytes.

        Anything that is not a positive budget within the bounds above ("1e400", 10**400,
        "0.5 B") is a BudgetError.
        """
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool):
            raise BudgetError(f"budget must be bytes or a share, got {value!r}")
        if isinstance(value, (int, float)):
            # no float() or isfinite() of an int: 10**400 overflows a float
            shown = _brief(value) if isinstance(value, int) else repr(value)
            if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
                raise BudgetError(f"budget must be a positive number of bytes, got {shown}")
            number = _as_fraction(value)
            if number <= 1:
                return cls(fraction=number)
            return cls(bytes=_plain_bytes(number, shown))
        if not isinstance(value, str):
            raise BudgetError(
                f"budget must be a str, int or float, got {value!r} of type {type(value).__name__}"
            )
        match = _BUDGET_RE.match(value)
        if match is None and _BUDGET_RE.match(value.strip().removeprefix("-")):
            raise BudgetError(f"budget must be positive, got {value!r}")
        if match is None:
            raise BudgetError(f"cannot parse budget {value!r}; {_HINT}")
        unit = match.group(3).lower()
        if unit != "%" and unit not in _UNITS:
            raise BudgetError(f"unknown unit {match.group(3)!r} in budget {value!r}")
        number = _exact(match.group(1), match.group(2))
        if number <= 0:
            raise BudgetError(f"budget must be positive, got {value!r}")
        if unit == "%" or (not unit and number <= 1):
            share = number / 100 if unit == "%" else number
            _check_share(share, repr(value))
            return cls(fraction=share)
        if not unit:
            return cls(bytes=_plain_bytes(number, repr(value)))
        return cls(bytes=_whole_bytes(number * _UNITS[unit], repr(value)))

    def resolve(self, unplanned_peak: int, *, of: str = "the unplanned peak") -> int:
        """The budget in bytes, given the unplanned peak: a share of it is rounded up from
        the exact product (50% of 1001 bytes is 501). BudgetError where a share comes to
        under 1 byte (`of` names the peak in the message)."""
        if self.bytes is not None:
            return self.bytes
        assert isinstance(self.fraction, Fraction)
        resolved = math.ceil(self.fraction * unplanned_peak)
        if not 1 <= resolved <= MAX_BUDGET_BYTES:
            raise BudgetError(
                f"budget {self} of {of} of {unplanned_peak} bytes is {resolved} bytes; "
                "a budget is 1 to 2**63 - 1 bytes"
            )
        return resolved

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{float(self.fraction * 100):g}%"
        return format_bytes(self.bytes or 0)


def _exact(mantissa: str, exponent: str | None) -> Fraction:
    """The exact value of the numeral `mantissa`e`exponent` ("1.001", "2e9", ".5e-3").

    Values beyond 10**+-_MAX_EXPONENT are clamped to 10**+-(_MAX_EXPONENT + 1): whatever the
    unit, Budget's bounds reject the clamped value exactly as they would the real one.
    """
    number = Decimal(mantissa)  # exact, and cheap however many digits it has
    if not number:
        return Fraction(0)
    digits = (exponent or "").lstrip("+-").lstrip("0") or "0"
    shift = int(digits) if len(digits) <= 9 else 10**9  # int() refuses very long strings
    if (exponent or "").startswith("-"):
        shift = -shift
    magnitude = number.adjusted() + shift
    if magnitude > _MAX_EXPONENT:
        return Fraction(10 ** (_MAX_EXPONENT + 1))
    if magnitude < -_MAX_EXPONENT:
        return Fraction(1, 10 ** (_MAX_EXPONENT + 1))
    return Fraction(number) * Fraction(10) ** shift


def _as_fraction(number: object) -> Fraction:
    """A budget number as an exact Fraction.

    A float is read as the shortest decimal that prints as it (0.29 is 29/100, not the
    binary 0.28999999999999998): a float share is a decimal someone typed, and its binary
    value would round 29% of 100 bytes to 28 or 30.
    """
    if isinstance(number, bool) or not isinstance(number, (int, float, Fraction)):
        raise BudgetError(
            f"budget fraction must be a number, got {number!r} of type {type(number).__name__}"
        )
    if isinstance(number, float):
        if not math.isfinite(number):
            raise BudgetError(f"budget fraction must be positive, got {number}")
        return Fraction(repr(number))
    return Fraction(number)


def _brief(number: int | Fraction) -> str:
    """A number for an error message, in scientific notation when it is long."""
    if isinstance(number, int) and abs(number) < 10**21:
        return str(number)
    return f"{Decimal(number.numerator) / Decimal(number.denominator):.4g}"


def _whole_bytes(size: Fraction, shown: str) -> int:
    """`size` bytes floored to whole bytes; BudgetError quoting `shown` if out of bounds."""
    if size > MAX_BUDGET_BYTES:
        raise BudgetError(f"budget {shown} is too large: at most 2**63 - 1 bytes")
    if size < 1:
        raise BudgetError(f"budget {shown} is less than 1 byte")
    return math.floor(size)


def _plain_bytes(number: Fraction, shown: str) -> int:
    """A plain number above 1 as bytes (`_whole_bytes`); BudgetError quoting `shown` where
    it is not whole and under 1 KiB, a size or a share whose unit was left out."""
    if number < _UNITS["kib"] and number.denominator != 1:
        typed = shown.strip("'\" ")
        raise BudgetError(
            f"budget {shown}: a plain number above 1 is bytes, and this is not whole; give "
            f"a unit ('{typed}GiB', '{typed}%')"
        )
    return _whole_bytes(number, shown)


def _check_share(share: Fraction, shown: str) -> None:
    """BudgetError quoting `shown` unless 1 / MAX_BUDGET_BYTES <= share <= MAX_BUDGET_BYTES."""
    if share > MAX_BUDGET_BYTES:
        raise BudgetError(f"budget {shown} is too large: at most 2**63 - 1 times the peak")
    if share * MAX_BUDGET_BYTES < 1:
        raise BudgetError(f"budget {shown} is too small: under 1 byte of any peak")
