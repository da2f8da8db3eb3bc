"""The store tests' definitions store; database, pool and run store come from above."""

from __future__ import annotations

import pytest

from store.definitions import DefinitionStore
from store.pool import Pool


@pytest.fixture
def definitions(pool: Pool) -> DefinitionStore:
    return DefinitionStore(pool)
