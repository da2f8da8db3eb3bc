"""Compiled workflows, cached by definition hash."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from workflows.compiler import compile_definition
from workflows.envelope import definition_hash
from workflows.steps import CompiledWorkflow


class DefinitionCache:
    """Compiled workflows by definition hash, least recently used dropped first.

    A claim looks its snapshot up here, so base64 is decoded and CEL compiled
    once per distinct definition per process, not once per job. Safe to share
    between threads. Failed compilations are not cached.
    """

    def __init__(self, maxsize: int = 256) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, CompiledWorkflow] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, envelope: Any, *, digest: str | None = None) -> CompiledWorkflow:
        """The compiled form of ``envelope``; pass ``digest`` when it is already known."""
        key = digest or definition_hash(envelope)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
        compiled = compile_definition(envelope, digest=key)
        with self._lock:
            self.misses += 1
            self._entries[key] = compiled
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return compiled

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# A process-wide cache for callers that have no reason to keep their own.
default_cache = DefinitionCache()
