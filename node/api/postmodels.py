"""Request and response models of the ``/v1`` routes that change state or spend credits: transfers, bonds, the
validator set (each a signed transaction: :class:`SubmittedOut`) and greedy generation through the swarm
(:class:`GenerateRequest`, :class:`GenerateOut`). Part of the OpenAPI schema, with the read side's models in
:mod:`node.api.models` (whose conventions apply: amounts, accounts, hex ids).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..encoding import AMOUNT_FORM
from ..web.models import AmountText
from .models import ACCOUNT_RE, Amount, SpanOut


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"] = Field(description="who says it")
    content: str = Field(max_length=100_000, description="what is said")


class GenerateRequest(BaseModel):
    prompt: str | None = Field(None, max_length=100_000, description="text, tokenized by the model's tokenizer")
    prompt_ids: list[int] | None = Field(None, max_length=100_000, description="token ids instead of text")
    messages: list[ChatMessage] | None = Field(
        None, min_length=1, max_length=256, description="a chat instead of a prompt: the model's own chat template "
        "(its tokenizer's) turns it into the prompt, ending with the assistant's turn to speak")
    max_new_tokens: int = Field(32, ge=1, le=4096)
    model: str | None = Field(None, max_length=128, description="the model to generate with: a name or id (at least "
                              "8 hex digits) of a model in this node's model cache; default: the node's model. "
                              "Only servers announcing that model id are routed through")
    redundancy: int | None = Field(None, ge=1, le=2, description="2: run every step on two routes with no server in "
                                   "common and compare them hop by hop; a mismatch is disputed (both hops' receipts "
                                   "go to a committee) and the generation finishes on a third route. Both routes "
                                   "are paid. Default: the node's --redundancy")


class MismatchOut(BaseModel):
    step: int = Field(..., description="the generation step (1-based) where the two routes disagreed")
    span: list[int] = Field(..., description="[start, end) blocks of the differing hops")
    hops_a: list[SpanOut]
    hops_b: list[SpanOut]
    distance_ppm: int = Field(..., description="relative L2 distance of their hidden states, parts per million")
    tolerance_ppm: int
    next_tokens: list[int] | None = Field(None, description="the two routes' next tokens, when those differed")
    disputed: list[str] = Field(..., description="receipt ids sent to a committee")
    finish: list[SpanOut] = Field(..., description="the third route the generation finished on")


class GenerateOut(BaseModel):
    prompt_ids: list[int]
    tokens: list[int]
    text: str | None
    route: list[SpanOut]
    receipts: list[str]
    seconds: float
    first_token_s: float | None = Field(None, description="seconds from the start of the generation to its first "
                                        "new token (the rest is later tokens and settling receipts); null with "
                                        "redundancy 2")
    redundancy: int = 1
    routes: list[list[SpanOut]] | None = Field(None, description="with redundancy 2: the two compared routes")
    mismatch: MismatchOut | None = None


class ValidatorTxRequest(BaseModel):
    action: str = Field(..., description="join (bond at least min_validator_bond first) or leave")


class TransferRequest(BaseModel):
    to: str = Field(..., max_length=128, pattern=ACCOUNT_RE, description="recipient peer ID")
    amount: AmountText = Field(..., description="decimal credits, e.g. \"1.5\": " + AMOUNT_FORM)


class BondRequest(BaseModel):
    amount: AmountText = Field(..., description="decimal credits to bond or unbond: " + AMOUNT_FORM)


class SubmittedOut(BaseModel):
    id: str = Field(..., description="transaction id")
    kind: str
    amount: Amount
    nonce: int
