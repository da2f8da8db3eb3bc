"""Handler registries, handler modules and the step context."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.workflows_fixtures import TOKENIZE
from workflows import HandlerRegistry, StepContext, default_registry, load_handler_modules


async def _echo(request: Any, ctx: StepContext) -> Any:
    return request


def test_the_decorator_registers_by_method() -> None:
    registry = HandlerRegistry()

    @registry.handler(TOKENIZE)
    async def tokenize(request: Any, ctx: StepContext) -> Any:
        return request

    assert registry.get(TOKENIZE) is tokenize
    assert TOKENIZE in registry
    assert registry.methods() == [TOKENIZE]
    assert len(registry) == 1


def test_a_second_handler_for_a_method_is_refused() -> None:
    registry = HandlerRegistry()
    registry.register(TOKENIZE, _echo)
    registry.register(TOKENIZE, _echo)  # the same function again is harmless

    async def other(request: Any, ctx: StepContext) -> Any:
        return request

    with pytest.raises(ValueError, match="already registered"):
        registry.register(TOKENIZE, other)
    registry.register(TOKENIZE, other, replace=True)
    assert registry.get(TOKENIZE) is other


def test_handlers_must_be_async_and_methods_well_formed() -> None:
    registry = HandlerRegistry()

    def blocking(request: Any, ctx: StepContext) -> Any:
        return request

    with pytest.raises(TypeError, match="must be an async function"):
        registry.register(TOKENIZE, blocking)
    with pytest.raises(ValueError, match=r"package\.Service/Method"):
        registry.register("Tokenize", _echo)


def _context(**options: Any) -> StepContext:
    """The context of step ``embed`` of job ``j``; ``options`` override the rest."""
    fields: dict[str, Any] = {"attempt": 1, "expires_at": 1e9, "response_type": object}
    return StepContext(job_id="j", step_name="embed", **{**fields, **options})


def test_the_context_derives_its_key_and_time_left() -> None:
    now = [100.0]
    ctx = _context(attempt=2, expires_at=105.0, clock=lambda: now[0])
    assert ctx.idempotency_key == "j:embed"
    assert ctx.deadline == 5.0
    now[0] = 107.0
    assert ctx.deadline == 0.0


def test_handler_modules_load_from_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wf_handlers_explicit.py").write_text(
        textwrap.dedent(
            """
            async def tokenize(request, ctx):
                return request

            def register_handlers(registry):
                registry.register("jobs.test.Tokenizer/Tokenize", tokenize)
            """
        )
    )
    (tmp_path / "wf_handlers_decorated.py").write_text(
        textwrap.dedent(
            """
            from workflows import handler

            @handler("jobs.test.Embedder/Embed")
            async def embed(request, ctx):
                return request
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = HandlerRegistry()
    try:
        modules = load_handler_modules(
            "wf_handlers_explicit, wf_handlers_decorated,", registry=registry
        )
        assert [module.__name__ for module in modules] == [
            "wf_handlers_explicit",
            "wf_handlers_decorated",
        ]
        assert registry.methods() == [TOKENIZE]
        assert "jobs.test.Embedder/Embed" in default_registry
    finally:
        default_registry._handlers.pop("jobs.test.Embedder/Embed", None)
        sys.modules.pop("wf_handlers_explicit", None)
        sys.modules.pop("wf_handlers_decorated", None)


def test_a_missing_handler_module_is_named() -> None:
    with pytest.raises(ImportError, match="handler module 'no_such_handlers_here'"):
        load_handler_modules(["no_such_handlers_here"])


def test_a_handler_module_whose_registration_fails_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker refuses to start on an ImportError with its one line; any
    # other error out of register_handlers was a traceback.
    (tmp_path / "wf_handlers_sync.py").write_text(
        textwrap.dedent(
            """
            def tokenize(request, ctx):
                return request

            def register_handlers(registry):
                registry.register("jobs.test.Tokenizer/Tokenize", tokenize)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ImportError) as caught:
            load_handler_modules(["wf_handlers_sync"], registry=HandlerRegistry())
    finally:
        sys.modules.pop("wf_handlers_sync", None)
    assert str(caught.value) == (
        "handler module 'wf_handlers_sync' cannot register its handlers: "
        "the handler for jobs.test.Tokenizer/Tokenize must be an async function"
    )


def test_progress_goes_to_the_sink_checked_and_cut() -> None:
    reports: list[tuple[str, float, str]] = []
    ctx = _context(
        progress_sink=lambda step, fraction, message: reports.append((step, fraction, message))
    )
    ctx.progress(0)
    ctx.progress(1, "x" * 2000)
    ctx.progress(0.5, "half")
    assert reports == [("embed", 0.0, ""), ("embed", 1.0, "x" * 500), ("embed", 0.5, "half")]
    for bad in (-0.1, 1.01, float("nan"), float("inf"), True, "0.5", None):
        with pytest.raises(ValueError, match="from 0 to 1"):
            ctx.progress(bad)  # type: ignore[arg-type]
    assert len(reports) == 3


def test_progress_without_a_sink_is_checked_and_goes_nowhere() -> None:
    ctx = _context()
    ctx.progress(0.3, "fine")
    with pytest.raises(ValueError):
        ctx.progress(2)
