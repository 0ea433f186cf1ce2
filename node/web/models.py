"""The pydantic types the capability routers share with the wallet API (:mod:`node.api.models`, whose conventions
apply): ``AmountText``, an amount as a user writes it, and ``ErrorOut``, the error reply of every route."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field

from ..encoding import AMOUNT_GRAMMAR, AmountSyntaxError, parse_amount

# The one spelling of an amount (node.encoding.AMOUNT_GRAMMAR): "12", "0.5", "1.000000001"; no sign, spaces,
# exponent, leading zeros, "1." or ".5". parse_amount then checks that it is positive and at most MAX_AMOUNT.
AMOUNT_RE = rf"^{AMOUNT_GRAMMAR}$"
AMOUNT_MAX_LENGTH = 64  # longer than any amount (at most 20 characters) so that a too-large one reads as such


def _amount_syntax(v: Any) -> Any:
    """Refuse a string that is not in the canonical amount syntax (422) with :func:`~node.encoding.parse_amount`'s
    message, which shows the accepted form (pydantic's own for ``pattern`` would show only the regular expression).
    Zero and too-large amounts pass here and are refused by the handler (400 ``bad_amount``); non-strings pass on
    to pydantic's type check."""
    if isinstance(v, str) and len(v) <= AMOUNT_MAX_LENGTH:
        try:
            parse_amount(v, allow_zero=True)
        except AmountSyntaxError:
            raise
        except ValueError:
            pass
    return v


# (the Field first: pydantic leaves a pattern placed after a BeforeValidator out of the JSON schema; the
# BeforeValidator runs before the pattern check either way)
AmountText = Annotated[str, Field(max_length=AMOUNT_MAX_LENGTH, pattern=AMOUNT_RE, examples=["1.5"]),
                       BeforeValidator(_amount_syntax)]


class ErrorOut(BaseModel):
    code: str = Field(..., description="machine-readable error code, e.g. not_found, bad_account, unauthorized")
    message: str
    details: list[Any] | None = None


__all__ = ["AMOUNT_MAX_LENGTH", "AMOUNT_RE", "AmountText", "ErrorOut"]
