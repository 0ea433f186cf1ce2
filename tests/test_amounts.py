"""The one amount syntax (node.encoding.parse_amount): property tests against an independent oracle over strings of
the full alphabet a user or an attacker might type (unicode digits, signs, spaces, exponents, separators), exact
round trips with format_amount, and the CLI's refusal of a bad --price-per-step before it talks to any node."""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import example, given, settings, strategies as st

from node.cli import build_parser
from node.encoding import AMOUNT_FORM, MAX_AMOUNT, AmountSyntaxError, format_amount, parse_amount

D = 9  # decimals of one credit (10^9 base units)
# The oracle, written independently of node.encoding: ASCII-only \d, explicit anchors, no leading zero.
ORACLE = re.compile(rf"\A(?:0|[1-9]\d*)(?:\.\d{{1,{D}}})?\Z", re.ASCII)

# Characters a careless or hostile client sends: ASCII digits, the point, signs, exponent letters, whitespace,
# separators, and non-ASCII digits that str.isdigit() and int() accept (fullwidth, Arabic-Indic, Devanagari,
# superscript, mathematical bold), plus the Arabic decimal separator and a fullwidth point.
ALPHABET = list("0123456789.+-eE _,\t\n\r\x0bxX") + ["\uff11", "\u0661", "\u0967", "\u00b2", "\U0001d7ce",
                                                    "\u066b", "\uff0e", "\u00a0", "\u2009", "\u2212", "\u0660"]
texts = st.one_of(
    st.text(alphabet=ALPHABET, max_size=24),
    st.text(alphabet="0123456789.", max_size=24),  # dense near the grammar: leading zeros, "1.", ".5", "1..2"
    st.from_regex(r"\A[0-9]{1,11}(\.[0-9]{0,11})?\Z"),
    st.from_regex(ORACLE),  # canonical ones, including the largest
    st.text(max_size=12),  # anything at all
)


def oracle_units(text: str) -> int | None:
    """Base units of ``text`` if it is canonical, by exact rational arithmetic (not parse_amount's method)."""
    if not ORACLE.match(text):
        return None
    return int(Fraction(Decimal(text)) * 10**D)


@settings(max_examples=1000, deadline=None)
@given(texts)
@example(" 1")
@example("1e0")
@example("+1E-9")
@example("1e3")
@example("\uff11")
@example("\u0661")
@example("1.")
@example(".5")
@example("01")
@example("00.5")
@example("1.0000000001")
@example("9223372036.854775807")
@example("9223372036.854775808")
@example("0")
@example("0.000000000")
@example("1\n")
@example("1_000")
@example("NaN")
def test_parser_accepts_exactly_the_canonical_grammar(text):
    want = oracle_units(text)
    if want is None:
        with pytest.raises(AmountSyntaxError) as e:
            parse_amount(text, allow_zero=True)
        assert AMOUNT_FORM in str(e.value)  # the message shows the accepted form
        with pytest.raises(AmountSyntaxError):
            parse_amount(text)
        return
    if want > MAX_AMOUNT:
        with pytest.raises(ValueError, match=re.escape("at most 9223372036.854775807 credits")):
            parse_amount(text)
        return
    assert parse_amount(text, allow_zero=True) == want
    if want == 0:
        with pytest.raises(ValueError, match="positive"):
            parse_amount(text)
    else:
        assert parse_amount(text) == want
    # round trip: the formatter writes the canonical amount without trailing zeros, which reads back the same
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    assert format_amount(want) == (f"{whole}.{frac}" if frac else whole)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.integers(0, MAX_AMOUNT), st.integers(0, 10**12), st.sampled_from([0, 1, 10**9, MAX_AMOUNT])))
def test_format_then_parse_is_the_identity(units):
    text = format_amount(units)
    assert ORACLE.match(text), text
    assert parse_amount(text, allow_zero=True) == units


def test_python_number_parsers_would_accept_what_we_refuse():
    """Why the grammar is spelled out: int(), float(), Decimal and str.isdigit take these; parse_amount does not."""
    for text in ("\uff11", "\u0661\u0662", "\U0001d7cf", " 1", "1_000", "+1", "1e3"):
        assert float(text) > 0 or Decimal(text) > 0
        with pytest.raises(AmountSyntaxError):
            parse_amount(text)
    assert "\u00b2".isdigit() and unicodedata.digit("\u00b2") == 2
    with pytest.raises(AmountSyntaxError):
        parse_amount("\u00b2")


@pytest.mark.parametrize("value", [1, 1.5, True, None, b"1", ["1"], Decimal("1")])
def test_non_strings_are_refused(value):
    with pytest.raises(AmountSyntaxError, match="an amount is a string"):
        parse_amount(value)


def test_huge_inputs_are_refused_quickly_and_say_why():
    with pytest.raises(ValueError, match="at most"):
        parse_amount("9" * 100_000)
    with pytest.raises(AmountSyntaxError, match="more precise than one base unit"):
        parse_amount("1." + "0" * 100_000)
    with pytest.raises(AmountSyntaxError) as e:
        parse_amount("1e" + "9" * 100_000)
    assert len(str(e.value)) < 500  # the echo of the input is cut short


@pytest.mark.parametrize("bad", [" 1", "1e0", "+1E-9", "1e3", "\uff11", "1.", ".5", "01", "0.0000000001", "-1",
                                 "1,5", "0", "9223372037"])
def test_cli_refuses_a_bad_price_with_the_form(bad, capsys, tmp_path):
    argv = ["job", "--data-dir", str(tmp_path), "post", "--play", "hamlet", "--price-per-step", bad]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --price-per-step:" in err
    assert ("plain decimal credits" in err) or ("positive" in err) or ("at most" in err), err
    assert not any(tmp_path.iterdir())  # nothing was written: no node was asked


def test_cli_passes_a_canonical_price_on_as_typed(tmp_path):
    argv = ["job", "--data-dir", str(tmp_path), "post", "--play", "hamlet", "--price-per-step", "0.050"]
    assert build_parser().parse_args(argv).price_per_step == "0.050"
    default = build_parser().parse_args(argv[:-2]).price_per_step
    assert parse_amount(default) == 10**7
