"""Kubernetes resource quantities (``500m``, ``2``, ``1.5Gi``, ``1e3``), exactly as the API server reads them.

Why one module for the whole product and the test bed: the agent (pod requests, node benchmark
factors), the information provider (the scheduler's arithmetic), the HTCJob operator (job sizes)
and the API emulator all read quantities, and each used to carry its own parser; they disagreed at
the edges (whitespace, non-ASCII digits, a trailing newline, NaN, huge exponents). Standard library
only, no I/O, so every room may import it (docs/internals.md, "Rooms and imports").

The grammar is k8s.io/apimachinery/pkg/api/resource's (``ParseQuantity`` in quantity.go, the
suffix table in suffix.go), restated here:

* a quantity is a signed number followed by at most one suffix, with nothing before, between or
  after them (no whitespace);
* the sign is ``+`` or ``-`` or absent; the number is ASCII digits with at most one decimal point,
  which may come first (``.5``) or last (``5.``);
* the suffix is binary (``Ki Mi Gi Ti Pi Ei``: powers of 1024), decimal SI (``n u m`` and
  ``k M G T P E``: powers of 1000; none at all means 1), or a decimal exponent: ``e`` or ``E``
  followed by a signed integer (``1e3``, ``2E-3``, ``1e+3``). ``E`` alone is exa, ``E3`` is an
  exponent. Case matters: ``K`` is not a suffix (``1k`` is 1000, ``1Ki`` 1024), nor is ``ki``;
* the value is kept exactly, except that a non-zero value is rounded away from zero to a whole
  number of nano units (``0.1n`` is ``1n``), and a binary-suffixed one is capped at 2^63-1 in
  magnitude (``9Ei`` is 9223372036854775807); decimal values are not capped.

The API server words its refusals in three ways, and `QuantityError.api_error` carries its text:
``quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'``
when the text is not a number followed by suffix letters (``NaN``, ``1 Gi``, ``1Gib``, ``1e3k``),
``unable to parse quantity's suffix`` when those letters are no suffix (``1K``, ``1ki``, ``1e``),
and ``unable to parse numeric part of quantity`` for some numbers without digits (``Pi``).

Where this module is stricter than the API server (verified against apimachinery v0.37.2), and why:

* a number with no digit at all (``Gi``, ``e3``, ``-``, ``.``) is refused; the API server's scanner
  reads it as 0, which is never what the writer meant, and every parser here always refused it;
* an exponent beyond ±`MAX_EXPONENT` and a number of more than `MAX_DIGITS` digits are refused;
  the API server keeps them (it even wraps an exponent beyond 32 bits around), but nothing it
  compares fits such a value, and they would cost unbounded work here.

A JSON document reaches ``ParseQuantity`` through the quantity's JSON decoder, which trims
surrounding white space and hands a JSON number over as its text (``Quantity.UnmarshalJSON``):
`decode_quantity` is that, `parse_quantity` is ``ParseQuantity`` itself (a CRD's CEL rule
``isQuantity(self)`` sees the string as it is).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

MAX_DIGITS = 100
MAX_EXPONENT = 100
MAX_BINARY = 2**63 - 1

API_FORMAT_ERROR = ("quantities must match the regular expression "
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
API_SUFFIX_ERROR = "unable to parse quantity's suffix"
API_NUMERIC_ERROR = "unable to parse numeric part of quantity"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIXES = "Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or e and an integer"

# The grammar above. Digits are [0-9], not \d (which takes any script's digits), and fullmatch is
# used, as "$" would let a trailing newline through.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))"
)
# What the API server's scanner lets through to the suffix table (else its format error): a
# number, then letters that may start a suffix, then an optional sign and digits.
_SCANNED = re.compile(r"[+-]?[0-9]*(?:\.[0-9]*)?(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)")
# Go's strings.TrimSpace (unicode.IsSpace), which is not Python's str.strip (that also strips
# \x1c-\x1f).
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"
_NANO = 10**9


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message names it.

    ``reason`` says why in words; ``api_error`` is the API server's own text for it, or None where
    the API server would take the text and only this module refuses it (see the module docstring).
    """

    def __init__(self, text: object, reason: str = "not a Kubernetes quantity", api_error: str | None = None) -> None:
        super().__init__(f"{text!r}: {reason}")
        self.text = text
        self.reason = reason
        self.api_error = api_error

    @property
    def server_message(self) -> str:
        """What the API server says about this value (its text where it has one)."""
        return self.api_error or self.reason


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string, as ``resource.ParseQuantity`` reads it (module docstring)."""
    if not isinstance(text, str):
        raise QuantityError(text, f"expected a string, got {type(text).__name__}")
    return _parse(text)


@lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction:
    """`parse_quantity`, remembered: the callers read the same few strings (``100m``, ``2Gi``) again and again."""
    m = _QUANTITY.fullmatch(text)
    if m is None or not text:
        raise _refusal(text)
    whole, frac = m["int"], m["frac"] or ""
    if not whole and not frac:
        raise QuantityError(text, "not a Kubernetes quantity (no digits)", _digitless_api_error(m))
    if len(whole) + len(frac) > MAX_DIGITS:
        raise QuantityError(text, f"not a Kubernetes quantity here (more than {MAX_DIGITS} digits)")
    value = Fraction(int(whole + frac), 10 ** len(frac))
    binary = m["bin"]
    if binary:
        value *= _BINARY[binary]
    else:
        exponent = _DECIMAL[m["dec"] or ""] if m["exp"] is None else _exponent(text, m["exp"])
        value *= Fraction(10) ** exponent
    if value.denominator != 1 and _NANO % value.denominator:
        value = Fraction(math.ceil(value * _NANO), _NANO)  # magnitude up: the sign is applied below
    if binary and value > MAX_BINARY:
        value = Fraction(MAX_BINARY)
    return -value if m["sign"] == "-" else value


def _int64(digits: str) -> int | None:
    """The signed integer after ``e`` as Go's ``strconv.ParseInt(s, 10, 64)`` reads it, or None when it overflows."""
    significant = digits.lstrip("+-").lstrip("0") or "0"
    if len(significant) > 19:  # 2**63 has 19 digits (and int() of a very long string would refuse)
        return None
    value = int(significant) * (-1 if digits.startswith("-") else 1)
    return value if -(2**63) <= value < 2**63 else None


def _exponent(text: str, digits: str) -> int:
    """The exponent after ``e``, within ±MAX_EXPONENT (the API server's own bound is 64 bits)."""
    exponent = _int64(digits)
    if exponent is not None and abs(exponent) <= MAX_EXPONENT:
        return exponent
    raise QuantityError(text, f"not a Kubernetes quantity here (exponent beyond ±{MAX_EXPONENT})",
                        None if exponent is not None else API_SUFFIX_ERROR)


def _digitless_api_error(m: re.Match[str]) -> str | None:
    """What the API server says about a number without digits (``Gi``, ``-``, ``.``, ``e3``).

    Its scanner lets it through as 0; its fast path then takes it as 0 (no error), while its exact
    path, taken for ``Pi``, ``Ei`` and an exponent below nano, fails on the empty number.
    """
    if m["bin"] in ("Pi", "Ei"):
        return API_NUMERIC_ERROR
    if m["exp"] is not None:
        exponent = _int64(m["exp"])
        if exponent is None:
            return API_SUFFIX_ERROR
        if (exponent + 2**31) % 2**32 - 2**31 < -9:  # Go keeps the exponent in 32 bits
            return API_NUMERIC_ERROR
    return None


def _refusal(text: str) -> QuantityError:
    """Why `text` is outside the grammar, told apart as the API server tells it apart."""
    scanned = _SCANNED.fullmatch(text)
    if text and scanned is not None:
        return QuantityError(text, f"not a Kubernetes quantity (unknown suffix {scanned['suffix']!r}; the suffixes "
                                   f"are {_SUFFIXES})", API_SUFFIX_ERROR)
    return QuantityError(text, f"not a Kubernetes quantity (a number, then nothing or one of {_SUFFIXES})",
                         API_FORMAT_ERROR)


def decode_quantity(value: object) -> Fraction:
    """A quantity field of a JSON document, as the API server decodes it (``Quantity.UnmarshalJSON``).

    A string loses the white space around it (Go's ``strings.TrimSpace``); a JSON number is read by
    its text (a float by its shortest decimal representation, so ``0.1`` means one tenth, not the
    nearest binary fraction). Anything else is refused: a boolean, and also ``null``, which the
    decoder would read as 0 but which every caller here means as "not set".
    """
    if isinstance(value, str):
        return parse_quantity(value.strip(_GO_SPACE))
    if isinstance(value, bool):
        raise QuantityError(value, "a boolean is not a quantity")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(value, "not a finite number")
        return parse_quantity(repr(value))
    if isinstance(value, int):
        try:
            text = str(value)
        except ValueError:  # beyond Python's int-to-string limit: far beyond MAX_DIGITS
            raise QuantityError(f"<integer of {value.bit_length()} bits>",
                                f"not a Kubernetes quantity here (more than {MAX_DIGITS} digits)") from None
        return parse_quantity(text)
    raise QuantityError(value, f"expected a string, got {type(value).__name__}")


def milli_value(quantity: Fraction) -> int:
    """Thousandths, rounded up (``Quantity.MilliValue``): the scheduler's unit for CPU (millicores)."""
    return math.ceil(quantity * 1000)


def int_value(quantity: Fraction) -> int:
    """The whole value, rounded up (``Quantity.Value``): bytes, GPUs, pod counts."""
    return math.ceil(quantity)


def quantity_float(value: object) -> float | None:
    """A quantity field as a float (cores, bytes, a factor), or None when it is unset or malformed.

    For callers that only need an approximate figure and treat a bad value as absent (the agent's
    accounting). The limits above keep every value below 10^201, within a float's range.
    """
    if value is None:
        return None
    try:
        return float(decode_quantity(value))
    except QuantityError:
        return None
