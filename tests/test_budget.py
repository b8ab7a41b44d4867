"""Budget: one grammar for every entry point, and its documented rounding (shares up,
sizes down), exact whatever floats would do."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from memplan.core.budget import Budget
from memplan.core.errors import BudgetError, MemplanError
from memplan.core.units import format_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("512 MB", 512 * 10**6),
        (" 7 b ", 7),
        ("1.5KiB", 1536),  # 1.5 * 1024
        ("1e3", 1000),
        (".5GB", 500_000_000),
        ("3 tib", 3 * 2**40),
        (6e9, 6_000_000_000),
        (123456, 123456),
        (1234.9, 1234),  # whole bytes, rounded down
    ],
)
def test_budget_parse_absolute(text, expected):
    budget = Budget.parse(text)
    assert budget.bytes == expected
    assert budget.fraction is None
    assert budget.resolve(10**15) == expected  # an absolute budget ignores the unplanned peak


@pytest.mark.parametrize(
    ("text", "fraction", "peak", "resolved"),
    [
        ("60%", 0.6, 1000, 600),  # 0.6 * 1000
        ("50 %", 0.5, 1001, 501),  # 500.5, rounded up
        ("150%", 1.5, 200, 300),  # above the unplanned peak is allowed
    ],
)
def test_budget_parse_percent(text, fraction, peak, resolved):
    budget = Budget.parse(text)
    assert budget.bytes is None
    assert budget.fraction == pytest.approx(fraction)
    assert budget.resolve(peak) == resolved


@pytest.mark.parametrize(
    ("text", "peak", "resolved"),
    [
        ("29%", 100, 29),  # 29/100 * 100; exact, where a float can round 29.000...01 up
        ("57%", 10000, 5700),  # 5700.000...1 in floats would round up to 5701
        ("58 %", 100, 58),
        ("28%", 100, 28),  # 28.000000000000004 in floats
        ("33.3333%", 3, 1),  # 0.999999, rounded up
        ("2.5e1%", 10, 3),  # 25% of 10 is 2.5, rounded up
        ("150%", 7, 11),  # 10.5, rounded up
        ("0.9", 46319, 41688),  # the literature's B = ceil(0.9 * P0) for random_layered_n100
    ],
)
def test_budget_percent_resolves_exactly(text, peak, resolved):
    assert Budget.parse(text).resolve(peak) == resolved


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.001 KB", 1001),  # 1.001 * 1000; in floats 1000.999..., floored to 1000
        ("8.2 MB", 8_200_000),  # 8199999.999... in floats
        ("4.1GB", 4_100_000_000),  # 4099999999.999... in floats
        ("0.1e1KiB", 1024),  # 1 KiB: the exponent is exact too
        ("1.0009765625 KiB", 1025),  # 1 + 1/1024 KiB, exactly
        ("1.9999 B", 1),  # whole bytes are floored, not rounded
        ("9223372036854775807", 2**63 - 1),  # the largest budget, no float in between
    ],
)
def test_budget_decimal_size_parses_exactly(text, expected):
    assert Budget.parse(text).bytes == expected


def test_budget_fraction_is_stored_exactly():
    assert Budget.parse("29%").fraction == Fraction(29, 100)
    # a float fraction is the decimal it prints as, so it resolves like the text
    assert Budget(fraction=0.29) == Budget.parse("29%")
    assert Budget(fraction=0.29).resolve(100) == 29
    assert Budget(fraction=Fraction(1, 3)).resolve(10) == 4  # 3.33, rounded up
    assert str(Budget.parse("57.3%")) == "57.3%"


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        0.0,
        -2.5,
        math.nan,
        math.inf,
        -math.inf,
        "abc",
        "5 parsecs",
        "",
        "%",
        "GB",
        "0GiB",
        "0%",
        "-5GB",
        "nan",
        "inf",
        True,
        False,
        None,
        [1],
        b"1GB",
    ],
)
def test_budget_parse_rejects(value):
    with pytest.raises(BudgetError):
        Budget.parse(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e400", r"budget '1e400' is too large: at most 2\*\*63 - 1 bytes"),
        (10**400, r"budget 1\.000e\+400 is too large"),  # not 400 digits
        (-(10**400), r"positive number of bytes, got -1\.000e\+400"),
        (2**63, "too large"),
        ("9223372036854775808", "too large"),  # 2**63: one byte over
        ("8.1 EB", "unknown unit 'EB'"),
        ("8388608 TiB", "too large"),  # 2**63 bytes
        (1e300, "too large"),
        ("1e99999999999999999999", "too large"),  # an exponent int() refuses to read
        ("1e-999999999 GB", "less than 1 byte"),  # not built exactly: that takes minutes
        ("0.5 B", "less than 1 byte"),
        # a plain number above 1 is bytes: under 1 KiB and not whole, a unit left out
        (3.5, r"budget 3\.5: a plain number above 1 is bytes.*'3\.5GiB', '3\.5%'"),
        ("2.5", r"budget '2\.5': a plain number above 1 is bytes.*'2\.5GiB', '2\.5%'"),
        (1023.5, "is not whole"),
        ("1e400%", r"too large: at most 2\*\*63 - 1 times the peak"),
        ("1e-999999999%", "too small: under 1 byte of any peak"),
        ("1e-18%", "too small"),  # 1e-20 * (2**63 - 1) bytes is under 1 byte
    ],
)
def test_budget_parse_rejects_out_of_range(value, message):
    with pytest.raises(BudgetError, match=message) as caught:
        Budget.parse(value)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 120


def test_budget_bounds_are_inclusive():
    assert Budget.parse(2**63 - 1).bytes == 2**63 - 1
    assert Budget.parse("1 B").bytes == 1
    assert Budget.parse("1.1e-17%").fraction == Fraction(11, 10**20)  # 1.01 B of 2**63 - 1
    assert Budget(fraction=Fraction(1, 2**63 - 1)).resolve(2**63 - 1) == 1
    with pytest.raises(BudgetError, match="too large"):
        Budget(bytes=2**63)
    with pytest.raises(BudgetError, match="too large"):
        Budget(fraction=1e19)
    with pytest.raises(BudgetError, match="too small"):
        Budget(fraction=Fraction(1, 2**63))
    with pytest.raises(BudgetError, match="too small"):
        Budget.parse("1e-17%")  # 1e-19 * (2**63 - 1) is 0.92 bytes


def test_budget_error_is_a_memplan_value_error():
    with pytest.raises(MemplanError, match="parsecs"):
        Budget.parse("5 parsecs")
    assert issubclass(BudgetError, ValueError)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"bytes": 1, "fraction": 0.5},
        {"bytes": 0},
        {"fraction": 0.0},
        {"fraction": math.nan},
        {"fraction": math.inf},
        {"fraction": "50%"},
        {"fraction": True},
    ],
)
def test_budget_constructor_validates(fields):
    with pytest.raises(BudgetError):
        Budget(**fields)


def test_budget_parse_passes_budgets_through_and_prints():
    budget = Budget(fraction=0.25)
    assert Budget.parse(budget) is budget
    assert str(budget) == "25%"
    assert str(Budget.parse("2GiB")) == "2.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"  # 1536 / 1024
    assert format_bytes(999) == "999 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"


@pytest.mark.parametrize(
    ("value", "share"),
    [
        (0.8, Fraction(4, 5)),
        ("0.8", Fraction(4, 5)),
        (" .25 ", Fraction(1, 4)),
        (1, Fraction(1)),  # all of the peak, not 1 byte
        ("1", Fraction(1)),
        ("1e-3", Fraction(1, 1000)),
    ],
)
def test_a_plain_number_up_to_1_is_a_share(value, share):
    assert Budget.parse(value) == Budget(fraction=share)


def test_a_plain_number_above_1_or_with_a_unit_is_bytes():
    assert Budget.parse(2).bytes == 2
    assert Budget.parse("1.5 B").bytes == 1  # "1.5" is refused: bytes are whole
    assert Budget.parse("1 B").bytes == 1
    assert Budget.parse("0.8 KiB").bytes == 819  # 819.2, floored


def test_a_share_of_no_bytes_is_refused_when_resolved():
    with pytest.raises(BudgetError, match="50% of the reference peak of 0 bytes is 0 bytes"):
        Budget.parse("50%").resolve(0, of="the reference peak")
