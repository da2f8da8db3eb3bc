"""In-process handlers for the sample workflow (``WFJOBS_HANDLERS=workflows.samples.handlers``).

Small, deterministic stand-ins for a tokenizer and an embedding model, so the
sample runs anywhere without a model server. Each is a pure function of its
request, which makes it trivially idempotent on ``ctx.idempotency_key``: a step
that runs again after a crash answers exactly what it answered before.

``ReviewDesk/Review`` is here for the benchmark, whose 3-step variant of the
sample reviews in-process; the dev workflow's review step is external, so the
engine never calls it there.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message

from workflows.invokers import HandlerRegistry, StepContext

PACKAGE = "wfjobs.samples.v1"
TOKENIZE = f"{PACKAGE}.Tokenizer/Tokenize"
EMBED = f"{PACKAGE}.Embedder/Embed"
REVIEW = f"{PACKAGE}.ReviewDesk/Review"

VOCABULARY_SIZE = 50_000
DIMENSIONS = 8

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)


def tokenize_text(text: str) -> tuple[list[str], list[int]]:
    """Lower-cased words, and a stable id for each (CRC-32 into the vocabulary)."""
    tokens = [match.group(0).lower() for match in _WORD.finditer(text)]
    ids = [zlib.crc32(token.encode()) % VOCABULARY_SIZE + 1 for token in tokens]
    return tokens, ids


def embed_ids(ids: list[int], dimensions: int = DIMENSIONS) -> list[float]:
    """A unit-length bag-of-ids vector: each id adds a deterministic +/-1 to two slots."""
    vector = [0.0] * dimensions
    for token_id in ids:
        mixed = zlib.crc32(token_id.to_bytes(4, "big"))
        for slot_bits in (mixed, mixed >> 16):
            slot = slot_bits % dimensions
            vector[slot] += 1.0 if (slot_bits >> 8) & 1 else -1.0
    norm = math.sqrt(sum(value * value for value in vector))
    if norm == 0.0:
        return vector
    # Rounded so the JSON checkpoint stays short and exactly reproducible.
    return [round(value / norm, 6) for value in vector]


async def tokenize(request: Message, ctx: StepContext) -> Mapping[str, Any]:
    tokens, ids = tokenize_text(request.text)  # type: ignore[attr-defined]
    return {"tokens": tokens, "ids": ids}


async def embed(request: Message, ctx: StepContext) -> Mapping[str, Any]:
    vector = embed_ids(list(request.ids))  # type: ignore[attr-defined]
    return {"vector": vector, "dimensions": len(vector)}


async def review(request: Message, ctx: StepContext) -> Mapping[str, Any]:
    """An automatic reviewer: approves any text that produced tokens."""
    approved = len(request.tokens) > 0  # type: ignore[attr-defined]
    note = "approved automatically" if approved else "nothing to review: the text had no words"
    return {"approved": approved, "note": note}


def register_handlers(registry: HandlerRegistry) -> None:
    """Called by ``load_handler_modules`` with the worker's registry."""
    registry.register(TOKENIZE, tokenize, replace=True)
    registry.register(EMBED, embed, replace=True)
    registry.register(REVIEW, review, replace=True)
