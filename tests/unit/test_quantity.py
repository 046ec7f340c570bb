"""Kubernetes quantities (``phalanx_kubeobjects.quantity``): the API server's grammar, its zero-forms
and caps, the exact integers Phalanx derives, and the bounds that name their rule."""

from __future__ import annotations

import pytest

from phalanx_kubeobjects.quantity import (
    GRAMMAR,
    MEMORY_MOST,
    Bound,
    Quantity,
    count,
    cpu_millis,
    decimal,
    integer,
    memory_bytes,
    parse,
)
from phalanx_kubeobjects.violations import Violation, shown

GPUS = Bound(64, "no node has more than 64 GPUs")
F = "spec.containers[app].resources.limits[nvidia.com/gpu]"
G = 10**9  # nanos per unit


def cases(*rows: tuple) -> list:
    return [pytest.param(*row, id=row[0]) for row in rows]


def bad(raw: str, rule: str = GRAMMAR, field: str = F) -> Violation:
    return Violation(field, raw, rule)


@pytest.mark.parametrize("case,raw,expected", cases(
    ("a plain integer is that many units", "4", Quantity(4 * G, "4")),
    ("a YAML integer is read as the number it writes", 8, Quantity(8 * G, "8")),
    ("a YAML float is read as the number it writes", 1.5, Quantity(1500 * 10**6, "1.5")),
    ("milli is a thousandth", "500m", Quantity(500 * 10**6, "500m")),
    ("micro and nano are decimal suffixes too", "3u", Quantity(3000, "3u")),
    ("k is a thousand", "2k", Quantity(2000 * G, "2k")),
    ("a lone E is exa, not an exponent", "1E", Quantity(10**18 * G, "1E")),
    ("Gi is a power of 1024", "16Gi", Quantity(16 * 2**30 * G, "16Gi")),
    ("a fraction of a binary suffix is exact", "1.5Gi", Quantity(3 * 2**29 * G, "1.5Gi")),
    ("e3 is an exponent", "1e3", Quantity(1000 * G, "1e3")),
    ("an upper-case exponent with a sign", "15E-1", Quantity(1500 * 10**6, "15E-1")),
    ("an exponent with a plus sign", "2e+2", Quantity(200 * G, "2e+2")),
    ("leading zeros are ignored", "007", Quantity(7 * G, "007")),
    ("a number may end in a point", "1.", Quantity(G, "1.")),
    ("a number may start with a point", ".5", Quantity(500 * 10**6, ".5")),
    ("a point may precede a suffix", "1.G", Quantity(G * G, "1.G")),
    ("surrounding white space is trimmed, as the API server trims it", " 2 ", Quantity(2 * G, "2")),
    ("a negative quantity parses (the resource rules refuse it later)", "-1", Quantity(-G, "-1")),
    ("a lone plus sign is zero, as the API server's scanner reads it", "+", Quantity(0, "+")),
    ("a lone point is zero, as the API server's scanner reads it", ".", Quantity(0, ".")),
    ("a value finer than a nano rounds away from zero", "0.1n", Quantity(1, "0.1n")),
    ("a vanishing exponent rounds up to one nano without computing 10^99999", "1e-99999", Quantity(1, "1e-99999")),
    ("a binary quantity is capped at 2^63-1 as the API server caps it", "9Ei", Quantity((2**63 - 1) * G, "9Ei")),
    ("just under the magnitude limit parses", "9e29", Quantity(9 * 10**29 * G, "9e29")),
))
def test_quantity_parse_reads_what_the_api_server_accepts(case: str, raw: object, expected: Quantity) -> None:
    assert parse(raw, F) == expected


@pytest.mark.parametrize("case,raw,expected", cases(
    ("an Arabic-Indic digit is not a number", "٤", bad("٤")),
    ("a full-width digit is not a number", "８", bad("８")),
    ("a superscript digit is not a number", "²", bad("²")),
    ("words are not numbers", "four", bad("four")),
    ("hexadecimal is not a quantity", "0x10", bad("0x10")),
    ("underscores are not digit separators", "1_000", bad("1_000")),
    ("an exponent cannot be followed by a suffix", "1e3Ki", bad("1e3Ki")),
    ("a space inside the number is not allowed", "1 000", bad("1 000")),
    ("an empty string is not a quantity", "", bad("", "a quantity cannot be empty")),
    ("a lower-case ki is not a suffix", "1ki", bad("1ki", f"'ki' is not a quantity suffix: {GRAMMAR}")),
    ("an upper-case K is not a suffix", "1K", bad("1K", f"'K' is not a quantity suffix: {GRAMMAR}")),
    ("a lone e is not an exponent", "1e", bad("1e", f"'e' is not a quantity suffix: {GRAMMAR}")),
    ("a binary suffix takes no digits after it", "1Ki3", bad("1Ki3", f"'Ki3' is not a quantity suffix: {GRAMMAR}")),
    ("an exponent beyond 64 bits is refused as the API server refuses it", "1e99999999999999999999",
     bad("1e99999999999999999999", f"'e99999999999999999999' is not a quantity suffix: {GRAMMAR}")),
    ("10^30 is refused before it is computed", "1e30",
     bad("1e30", "quantities of 10^30 or more are beyond any resource Phalanx schedules")),
    ("a huge exponent is refused before it is computed", "1e999999999",
     bad("1e999999999", "quantities of 10^30 or more are beyond any resource Phalanx schedules")),
    ("text longer than 64 characters is refused", "1" * 65,
     bad("1" * 65, "a quantity Phalanx reads has at most 64 characters")),
    ("a boolean is not a quantity", True, bad("true", "a quantity is a string such as \"4\" or a number, not true")),
    ("null is not a quantity", None, bad("null", "a quantity is a string such as \"4\" or a number, not null")),
    ("a list is not a quantity", [4], bad("a list", "a quantity is a string such as \"4\" or a number, not a list")),
    ("infinity is not a quantity", float("inf"), bad("inf", "a quantity is a finite number")),
))
def test_quantity_parse_refuses_what_the_api_server_rejects(case: str, raw: object, expected: Violation) -> None:
    assert parse(raw, F) == expected


@pytest.mark.parametrize("case,raw,expected", cases(
    ("four GPUs", "4", 4),
    ("a YAML integer", 8, 8),
    ("an exponent that is an integer", "1e0", 1),
    ("milli that adds up to whole units", "2000m", 2),
    ("an Arabic-Indic four is refused", "٤", bad("٤")),
    ("a full-width eight is refused", "８", bad("８")),
    ("half a GPU is not an integer", "0.5",
     bad("0.5", "must be an integer (the API server's rule for extended resources)")),
    ("a negative count is refused", "-1", bad("-1", "must be greater than or equal to 0")),
    ("zero is below the least the caller allows", "0", bad("0", "must be at least 1")),
    ("10^20 GPUs name the bound's rule", "100000000000000000000",
     bad("100000000000000000000", "must be at most 64: no node has more than 64 GPUs")),
    ("10^20 as a YAML integer names the bound's rule", 10**20,
     bad("100000000000000000000", "must be at most 64: no node has more than 64 GPUs")),
    ("1e20 names the bound's rule", "1e20", bad("1e20", "must be at most 64: no node has more than 64 GPUs")),
    ("a suffix that makes it huge names the bound's rule", "1Ki",
     bad("1Ki", "must be at most 64: no node has more than 64 GPUs")),
    ("an integer too long to print is shown by its size", 10**5000,
     bad(f"an integer of {(10**5000).bit_length()} bits", "a quantity Phalanx reads has at most 64 characters")),
))
def test_quantity_count_is_a_bounded_whole_number(case: str, raw: object, expected: int | Violation) -> None:
    assert count(raw, F, most=GPUS, least=1) == expected


@pytest.mark.parametrize("case,raw,millis", cases(
    ("two cores", "2", 2000),
    ("half a core", "0.5", 500),
    ("millicores as written", "250m", 250),
    ("a fraction of a millicore rounds up, as MilliValue does", "100u", 1),
    ("a YAML integer", 3, 3000),
    ("a million cores is the bound", "1000001", Violation("cpu", "1000001", "must be at most 1000000000: no node "
                                                          "has a million CPU cores (10^9 millicores)")),
))
def test_quantity_cpu_in_millicores(case: str, raw: object, millis: int | Violation) -> None:
    assert cpu_millis(raw, "cpu") == millis


@pytest.mark.parametrize("case,raw,nbytes", cases(
    ("gibibytes", "16Gi", 16 * 2**30),
    ("gigabytes", "1G", 10**9),
    ("an exponent", "129e6", 129_000_000),
    ("a fraction of a byte rounds up, as Value does", "1.5", 2),
    ("milli-bytes round up to a byte", "1m", 1),
    ("10^20 MiB names the bound's rule", "100000000000000000000Mi",
     Violation("memory", "100000000000000000000Mi", f"must be at most {MEMORY_MOST.most}: {MEMORY_MOST.rule}")),
))
def test_quantity_memory_in_bytes(case: str, raw: object, nbytes: int | Violation) -> None:
    assert memory_bytes(raw, "memory") == nbytes


REPLICA = Bound(64, "replica is a number of GPUs on one node")
L = "metadata.labels[replica]"


@pytest.mark.parametrize("case,raw,expected", cases(
    ("ASCII digits", "4", 4),
    ("an Arabic-Indic four is refused", "٤", Violation(L, "٤", "must be a whole number written with ASCII digits 0-9 only")),
    ("a full-width eight is refused", "８", Violation(L, "８", "must be a whole number written with ASCII digits 0-9 only")),
    ("a sign is not a digit", "+4", Violation(L, "+4", "must be a whole number written with ASCII digits 0-9 only")),
    ("a suffix is not a digit", "4k", Violation(L, "4k", "must be a whole number written with ASCII digits 0-9 only")),
    ("an empty value is refused", "", Violation(L, "", "must be a whole number written with ASCII digits 0-9 only")),
    ("an unquoted number is not a label value", 4,
     Violation(L, "4", "label values are strings: write the number in quotes, e.g. \"4\"")),
    ("zero is below the least", "0", Violation(L, "0", "must be at least 1")),
    ("10^20 names the bound's rule", "1" + "0" * 20,
     Violation(L, "1" + "0" * 20, "must be at most 64: replica is a number of GPUs on one node")),
))
def test_quantity_decimal_reads_label_integers(case: str, raw: object, expected: int | Violation) -> None:
    assert decimal(raw, L, most=REPLICA) == expected


P = "spec.parallelism"
PODS = Bound(150_000, "no cluster runs more pods")


@pytest.mark.parametrize("case,raw,expected", cases(
    ("an integer", 4, 4),
    ("zero is allowed where the caller allows it", 0, 0),
    ("a word is refused, not read as 1", "four", Violation(P, "four", "must be an integer (a number without "
                                                                      "quotes or decimal point)")),
    ("a quoted number is refused as the API server refuses it", "4",
     Violation(P, "4", "must be an integer (a number without quotes or decimal point)")),
    ("a boolean is refused", True, Violation(P, "true", "must be an integer (a number without quotes or decimal point)")),
    ("a float is refused", 4.0, Violation(P, "4.0", "must be an integer (a number without quotes or decimal point)")),
    ("negative is refused", -1, Violation(P, "-1", "must be at least 0")),
    ("10^20 names the bound's rule", 10**20, Violation(P, "100000000000000000000",
                                                       "must be at most 150000: no cluster runs more pods")),
))
def test_quantity_integer_reads_integer_fields(case: str, raw: object, expected: int | Violation) -> None:
    assert integer(raw, P, most=PODS) == expected


def test_quantity_violations_show_long_values_cut_with_their_length() -> None:
    assert shown("x" * 200_000) == "x" * 60 + "... (200000 characters)"
    assert str(Violation("f", "a\x1b[31m", "r")) == "f = 'a\\x1b[31m': r"
