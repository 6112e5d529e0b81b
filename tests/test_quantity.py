"""Kubernetes quantities are read exactly, and as the API server reads them (`ce_k8s.quantity`).

The grammar is k8s.io/apimachinery/pkg/api/resource's (quantity.go ``ParseQuantity``, suffix.go):
<signedNumber><suffix> with a binary-SI, decimal-SI or decimal-exponent suffix; the scheduler
compares MilliValue() for CPU and Value() (rounded up) for everything else (issue 6: "parse every
Kubernetes quantity form exactly"). The expected values and the API server's error texts below are
those of apimachinery v0.37.2's ParseQuantity, run on the same strings; where this module is
stricter on purpose (no digits, the digit and exponent limits) the module docstring says why.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ce_k8s.quantity import (
    API_FORMAT_ERROR,
    API_NUMERIC_ERROR,
    API_SUFFIX_ERROR,
    MAX_BINARY,
    MAX_DIGITS,
    MAX_EXPONENT,
    QuantityError,
    decode_quantity,
    int_value,
    milli_value,
    parse_quantity,
    quantity_float,
)

FORMS = [
    ("100m", Fraction(1, 10)),
    ("1.5", Fraction(3, 2)),
    ("64Gi", 64 * 2**30),
    ("1e3", 1000),
    ("1E3", 1000),
    ("2e-3", Fraction(2, 1000)),
    ("500M", 500 * 10**6),
    ("1k", 1000),
    ("1Ki", 1024),
    ("3E", 3 * 10**18),  # "E" alone is exa, not an exponent
    ("0.5Mi", 512 * 1024),
    (".5", Fraction(1, 2)),
    ("5.", 5),
    ("+7", 7),
    ("-1", -1),
    ("250u", Fraction(250, 10**6)),
    ("10n", Fraction(10, 10**9)),
    ("31850m", Fraction(31850, 1000)),
    # from the API server's grammar, checked against ParseQuantity
    ("+1", 1),
    ("1.5Gi", 1536 * 2**20),
    ("1Ei", 2**60),
    ("7Ei", 7 * 2**60),
    ("1e+3", 1000),
    ("1E-3", Fraction(1, 1000)),
    ("1e03", 1000),
    ("1.e3", 1000),
    ("1T", 10**12),
    ("1P", 10**15),
    ("1Pi", 2**50),
    ("0.001Ki", Fraction(1024, 1000)),
    ("1.1Ki", Fraction(11264, 10)),
    ("00001", 1),
    ("-0", 0),
    ("0.0", 0),
    ("0e0", 0),
    (f"1e{MAX_EXPONENT}", 10**MAX_EXPONENT),
    ("1" * MAX_DIGITS, int("1" * MAX_DIGITS)),
]


@pytest.mark.parametrize(("text", "value"), FORMS)
def test_quantity_forms(text, value):
    """Every suffix family of the quantity grammar parses to the exact rational value."""
    assert parse_quantity(text) == value
    assert decode_quantity(text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("0.9n", Fraction(1, 10**9)),
    ("0.1n", Fraction(1, 10**9)),
    ("1e-10", Fraction(1, 10**9)),
    ("-0.1n", Fraction(-1, 10**9)),
    ("0.5m", Fraction(5, 10**4)),                 # representable in nano units: kept
    ("0.0000000001Ki", Fraction(103, 10**9)),     # 102.4n, up to 103n
    (f"1e-{MAX_EXPONENT}", Fraction(1, 10**9)),
])
def test_values_finer_than_nano_round_away_from_zero(text, value):
    """ParseQuantity keeps nano precision and rounds a finer non-zero value up ("if you want some
    resources, you should get some"): 0.1n is 1n, never 0."""
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("8Ei", MAX_BINARY),
    ("9Ei", MAX_BINARY),
    ("-8Ei", -MAX_BINARY),
    ("8192Pi", MAX_BINARY),
    ("12345678901234567890123", 12345678901234567890123),  # decimal: not capped
    ("10E", 10 * 10**18),
])
def test_binary_values_are_capped_at_int64_decimal_ones_are_not(text, value):
    """A binary-SI quantity beyond 2^63-1 is capped there; a decimal one keeps its value."""
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1x", "Gi", "1 Gi", "1.2.3", "1ki", "1e", "--1", "1Gib", "e3", "1e3k"])
def test_malformed_quantities_are_typed_errors(text):
    """Anything outside the grammar is a QuantityError naming the text, never a silent 0."""
    with pytest.raises(QuantityError) as info:
        decode_quantity(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(("text", "api_error"), [
    ("1K", API_SUFFIX_ERROR),        # K is not a suffix: 1k is 1000, 1Ki is 1024
    ("1ki", API_SUFFIX_ERROR),
    ("1e", API_SUFFIX_ERROR),
    ("1Ee3", API_SUFFIX_ERROR),
    ("1mi", API_SUFFIX_ERROR),
    ("1e+", API_SUFFIX_ERROR),
    ("--1", API_SUFFIX_ERROR),
    ("1+1", API_SUFFIX_ERROR),
    ("Ki1", API_SUFFIX_ERROR),
    ("1e99999999999999999999", API_SUFFIX_ERROR),  # beyond a 64-bit exponent
    ("", API_FORMAT_ERROR),
    ("NaN", API_FORMAT_ERROR),
    ("nan", API_FORMAT_ERROR),
    ("Inf", API_FORMAT_ERROR),
    ("1 Gi", API_FORMAT_ERROR),
    (" 1", API_FORMAT_ERROR),        # ParseQuantity takes no white space
    ("1 ", API_FORMAT_ERROR),
    ("1\n", API_FORMAT_ERROR),
    ("1.2.3", API_FORMAT_ERROR),
    ("1..", API_FORMAT_ERROR),
    ("1Gib", API_FORMAT_ERROR),
    ("1e3k", API_FORMAT_ERROR),
    ("1e1.5", API_FORMAT_ERROR),
    ("1e3Ki", API_FORMAT_ERROR),
    ("\u0661", API_FORMAT_ERROR),    # ARABIC-INDIC DIGIT ONE: only ASCII digits are digits
    ("\uff11Gi", API_FORMAT_ERROR),  # FULLWIDTH DIGIT ONE
    ("Pi", API_NUMERIC_ERROR),
    ("e-10", API_NUMERIC_ERROR),
])
def test_refusals_carry_the_api_servers_text(text, api_error):
    """Each refusal of ParseQuantity comes with the API server's own words (the emulator answers
    with them), and a readable reason that names the input."""
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert info.value.api_error == api_error and info.value.server_message == api_error
    assert str(info.value).startswith(f"{text!r}: not a Kubernetes quantity")


def test_an_unknown_suffix_is_named():
    with pytest.raises(QuantityError, match=re.escape("unknown suffix 'K'")):
        parse_quantity("1K")


@pytest.mark.parametrize(("text", "reason"), [
    ("Gi", "no digits"),
    ("e3", "no digits"),
    ("-", "no digits"),
    ("+", "no digits"),
    (".", "no digits"),
    (".Gi", "no digits"),
    (f"1e{MAX_EXPONENT + 1}", f"exponent beyond ±{MAX_EXPONENT}"),
    (f"1e-{MAX_EXPONENT + 1}", f"exponent beyond ±{MAX_EXPONENT}"),
    ("1e4294967296", f"exponent beyond ±{MAX_EXPONENT}"),  # the API server wraps it to e0
    ("1" * (MAX_DIGITS + 1), f"more than {MAX_DIGITS} digits"),
    ("0." + "0" * MAX_DIGITS + "1", f"more than {MAX_DIGITS} digits"),
])
def test_stricter_than_the_api_server_on_purpose(text, reason):
    """What the API server would take but this module refuses (module docstring): a number without
    digits (read there as 0), and values beyond the digit and exponent limits. No API text: the
    emulator's answer is the reason."""
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert reason in info.value.reason and info.value.api_error is None
    assert info.value.server_message == info.value.reason


def test_json_decoding_trims_white_space_as_the_api_server_does():
    """Quantity.UnmarshalJSON trims the string (Go's strings.TrimSpace) before ParseQuantity; a
    space inside stays an error, and so does a character Go does not count as space."""
    assert decode_quantity(" 1Gi\n") == 2**30
    assert decode_quantity("\u00a02\t") == 2
    for text in ("1 Gi", "1\x1c"):
        with pytest.raises(QuantityError):
            decode_quantity(text)


def test_json_numbers_and_other_types():
    """A JSON number is read by its text; booleans, null and containers are no quantities."""
    assert decode_quantity(2) == 2
    assert decode_quantity(-3) == -3
    assert decode_quantity(1e3) == 1000
    assert decode_quantity(1.5e-7) == Fraction(15, 10**8)
    for value, reason in [(True, "boolean"), (None, "NoneType"), ([1], "list"), (float("nan"), "finite"),
                          (float("inf"), "finite"), (10**5000, "digits")]:
        with pytest.raises(QuantityError, match=reason):
            decode_quantity(value)
    with pytest.raises(QuantityError, match="expected a string"):
        parse_quantity(2)  # type: ignore[arg-type]


def test_floats_are_not_binary_approximations():
    """0.1 + 0.2 CPUs is exactly 300 millicores: a JSON float is read by its decimal text."""
    assert decode_quantity(0.1) == Fraction(1, 10)
    assert milli_value(decode_quantity(0.1)) + milli_value(decode_quantity(0.2)) == 300


def test_milli_and_whole_values_round_up():
    """MilliValue and Value round up, as the scheduler's Quantity does."""
    assert milli_value(Fraction(1, 3000)) == 1  # 0.33m -> 1m
    assert milli_value(parse_quantity("2")) == 2000
    assert int_value(Fraction(1, 2)) == 1
    assert int_value(parse_quantity("1.1Ki")) == 1127
    assert int_value(parse_quantity("1Mi")) == 2**20


def test_quantity_float_is_none_for_unset_or_malformed():
    """The agent's accounting reads a factor or a request as a float and treats a bad one as absent."""
    assert quantity_float("1.12") == 1.12
    assert quantity_float("500m") == 0.5
    assert quantity_float(2) == 2.0
    assert quantity_float(" 2 ") == 2.0
    assert quantity_float("0.1Gi") == 0.1 * 2**30
    for value in (None, "", "1K", "NaN", "lots", True, float("nan"), f"1e{MAX_EXPONENT + 1}"):
        assert quantity_float(value) is None


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["m", "", "k", "Ki", "Mi", "Gi", "M", "G"]))
def test_integer_quantities_roundtrip(n, suffix):
    """n<suffix> equals n times the suffix's multiplier, for every suffix."""
    mult = {"m": Fraction(1, 1000), "": 1, "k": 1000, "Ki": 1024, "Mi": 2**20, "Gi": 2**30, "M": 10**6,
            "G": 10**9}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * mult


_MULTIPLIER = {"Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
               "Pi": Fraction(2**50), "Ei": Fraction(2**60), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
               "m": Fraction(1, 1000), "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6),
               "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18)}


@given(st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=20),
       st.none() | st.text("0123456789", max_size=12),
       st.sampled_from(sorted(_MULTIPLIER)) | st.integers(-30, 30).map(lambda e: f"e{e:+d}"))
def test_every_well_formed_quantity_is_its_value(sign, whole, frac, suffix):
    """sign, digits, an optional point and digits, one suffix: the value, rounded up to nano units
    and, with a binary suffix, capped at 2^63-1, as ParseQuantity keeps it (computed here with
    Decimal, independently of the module)."""
    number = whole + ("" if frac is None else "." + frac)
    text = f"{sign}{number}{suffix}"
    if not whole and not frac:
        with pytest.raises(QuantityError) as info:
            parse_quantity(text)
        assert "no digits" in info.value.reason or text == ""  # "" is the API server's format error
        return
    magnitude = Fraction(Decimal(number))
    if suffix.startswith("e"):
        magnitude *= Fraction(10) ** int(suffix[1:])
    else:
        magnitude *= _MULTIPLIER[suffix]
    nanos = magnitude * 10**9
    if nanos.denominator != 1:
        magnitude = Fraction(-(-nanos.numerator // nanos.denominator), 10**9)
    if suffix.endswith("i"):
        magnitude = min(magnitude, Fraction(MAX_BINARY))
    assert parse_quantity(text) == (-magnitude if sign == "-" else magnitude)


@given(st.text(st.sampled_from("0123456789.+-eEinumkKMGTP x\n\u0661"), max_size=10))
def test_any_text_is_a_value_or_a_quantity_error(text):
    """No input escapes as another exception, and what is accepted is inside the grammar."""
    grammar = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?|[eE][+-]?[0-9]+)")
    try:
        parse_quantity(text)
    except QuantityError as exc:
        assert repr(text) in str(exc)
        assert not grammar.fullmatch(text) or "exponent" in exc.reason
    else:
        assert grammar.fullmatch(text)
