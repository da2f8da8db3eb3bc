"""Compiled workflows, cached by definition hash."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from schemas.errors import InvalidArgument
from workflows.compiler import check_envelope_limits, compile_definition
from workflows.envelope import DefinitionError, definition_hash
from workflows.protojson import describe_value
from workflows.rules import DEFAULT_LIMITS, RuleLimits
from workflows.steps import CompiledWorkflow

if TYPE_CHECKING:
    # Not imported at run time: ``python -m workflows.checker`` must find the
    # package without it.
    from workflows.checker import DefinitionChecker

# Compilation off the event loop: few threads, so that a burst of submits
# queues here instead of taking turns with the loop for the interpreter.
_COMPILE_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="wfjobs-compile")


class DefinitionCache:
    """Compiled workflows by definition hash, least recently used dropped first.

    A claim looks its hash up here, so base64 is decoded and CEL compiled
    once per distinct definition per process, not once per job. Safe to share
    between threads. Failed compilations are not cached.

    Every rule must fit ``limits``. With ``probe`` off, :meth:`get` does not
    evaluate rules against probe values: for a service whose snapshots were
    checked in full when they were submitted (see :meth:`compile_checked`).
    """

    def __init__(
        self, maxsize: int = 256, *, limits: RuleLimits = DEFAULT_LIMITS, probe: bool = True
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.limits = limits
        self.probe = probe
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, CompiledWorkflow] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, envelope: Any, *, digest: str | None = None) -> CompiledWorkflow:
        """The compiled form of ``envelope``; pass ``digest`` when it is already known."""
        key = digest or definition_hash(envelope)
        found = self._lookup(key)
        if found is not None:
            return found
        compiled = compile_definition(envelope, digest=key, limits=self.limits, probe=self.probe)
        with self._lock:
            self.misses += 1
            self._entries[key] = compiled
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return compiled

    async def get_off_loop(self, envelope: Any, *, digest: str | None = None) -> CompiledWorkflow:
        """``get`` for a caller on the event loop: a definition not cached here is
        hashed and compiled on a compile thread, as its size is its author's choice."""
        found = self._lookup(digest) if digest else None
        if found is not None:
            return found
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _COMPILE_THREADS, functools.partial(self.get, envelope, digest=digest)
        )

    def cached(self, digest: str) -> CompiledWorkflow | None:
        """The compiled form of the definition hashed ``digest``, if it is here."""
        return self._lookup(digest)

    def _lookup(self, key: str) -> CompiledWorkflow | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return found

    async def compile_checked(
        self, envelope: Mapping[str, Any], checker: DefinitionChecker
    ) -> CompiledWorkflow:
        """The compiled form of a definition someone is submitting or storing.

        Nothing runs on the event loop but the cache lookup: the hash, the
        limits and the compilation run on a compile thread, and the rules are
        evaluated against probe values in ``checker``'s child process, under
        its time limit. A definition already cached was checked before.
        """
        if not isinstance(envelope, Mapping):
            raise DefinitionError(
                f"a workflow definition must be a JSON object, got {describe_value(envelope)}"
            )
        loop = asyncio.get_running_loop()
        key = await loop.run_in_executor(_COMPILE_THREADS, self._prepare, envelope, checker)
        found = self._lookup(key)
        if found is not None:
            return found
        await loop.run_in_executor(_COMPILE_THREADS, checker.check, envelope)
        return await loop.run_in_executor(_COMPILE_THREADS, self._compile, envelope, key)

    async def validate_inputs(
        self, checks: Sequence[tuple[CompiledWorkflow, Any]]
    ) -> list[dict[str, Any] | InvalidArgument]:
        """Each ``compiled.validate_input(input)``, or why that input does not fit,
        on a compile thread, one hop for them all: it runs the first step's rules
        against each input, whose size the submitter chooses."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_COMPILE_THREADS, _validate_each, checks)

    def _prepare(self, envelope: Mapping[str, Any], checker: DefinitionChecker) -> str:
        key = definition_hash(envelope)
        if key not in self:
            # The cheap refusal first: no child process is asked about a rule
            # that is too long or nests too deep.
            check_envelope_limits(envelope, checker.limits)
        return key

    def _compile(self, envelope: Mapping[str, Any], key: str) -> CompiledWorkflow:
        return self.get(envelope, digest=key)

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _validate_each(
    checks: Sequence[tuple[CompiledWorkflow, Any]],
) -> list[dict[str, Any] | InvalidArgument]:
    checked: list[dict[str, Any] | InvalidArgument] = []
    for compiled, input in checks:
        try:
            checked.append(compiled.validate_input(input))
        except InvalidArgument as exc:
            checked.append(exc)
    return checked


# A process-wide cache for callers that have no reason to keep their own.
default_cache = DefinitionCache()
