"""The authenticator's memory of verified tokens: short, and one lookup per burst."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from schemas.errors import Unauthenticated
from store.tokens import TokenRecord
from streams.auth import Authenticator

RECORD = TokenRecord(
    id="0123456789ab",
    principal="alice",
    scopes=("read",),
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    revoked_at=None,
)


class CountingTokens:
    """A token store that answers after a pause and counts its lookups."""

    def __init__(self, record: TokenRecord | None) -> None:
        self.record = record
        self.lookups = 0
        self.answer = asyncio.Event()

    async def verify(self, token: str) -> TokenRecord | None:
        self.lookups += 1
        await self.answer.wait()
        return self.record


async def test_a_burst_with_one_token_waits_for_one_lookup() -> None:
    tokens = CountingTokens(RECORD)
    authenticator = Authenticator(lambda: tokens)  # type: ignore[arg-type, return-value]
    callers = [
        asyncio.create_task(authenticator.authenticate("Bearer wfj_0123456789ab_secret"))
        for _ in range(20)
    ]
    await asyncio.sleep(0)
    tokens.answer.set()
    answered = await asyncio.gather(*callers)
    assert tokens.lookups == 1
    assert {caller.principal for caller in answered} == {"alice"}


async def test_a_caller_that_goes_away_does_not_cancel_the_others_lookup() -> None:
    tokens = CountingTokens(RECORD)
    authenticator = Authenticator(lambda: tokens)  # type: ignore[arg-type, return-value]
    first = asyncio.create_task(authenticator.authenticate("Bearer wfj_0123456789ab_secret"))
    second = asyncio.create_task(authenticator.authenticate("Bearer wfj_0123456789ab_secret"))
    await asyncio.sleep(0)
    first.cancel()
    tokens.answer.set()
    assert (await second).principal == "alice"
    assert tokens.lookups == 1


async def test_an_unknown_token_is_looked_up_again_every_time() -> None:
    tokens = CountingTokens(None)
    tokens.answer.set()
    authenticator = Authenticator(lambda: tokens)  # type: ignore[arg-type, return-value]
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate("Bearer wfj_0123456789ab_made-up")
    assert tokens.lookups == 3
