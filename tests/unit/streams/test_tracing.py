"""W3C trace context in, spans' context out; the service without OpenTelemetry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams.settings import Settings, SettingsError
from streams.tracing import TraceContext, headers_of, incoming

ROOT = Path(__file__).resolve().parents[3]
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_and_its_tracestate_are_kept() -> None:
    assert incoming(VALID, "congo=t61rcWkgMzE") == TraceContext(VALID, "congo=t61rcWkgMzE")
    assert incoming(VALID.encode(), b"a=b") == TraceContext(VALID, "a=b")
    # A later version may carry more fields; this reader keeps what it knows.
    future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
    assert incoming(future, None) == TraceContext(future)


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "",
        "junk",
        VALID.upper(),
        VALID + "-extra",  # version 00 has exactly four fields
        "ff" + VALID[2:],  # the one forbidden version
        # A later version's fields are header text too: no NUL, no control character.
        "cc" + VALID[2:] + "-a\x00b",
        "cc" + VALID[2:] + "-\x1b[2J",
        b"cc" + VALID[2:].encode() + b"-\x00",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        b"\xff\xfe",
    ],
)
def test_a_malformed_traceparent_is_ignored(traceparent: str | bytes | None) -> None:
    assert incoming(traceparent, "a=b") is None


def test_a_tracestate_that_cannot_be_passed_on_is_dropped_alone() -> None:
    assert incoming(VALID, "x" * 513) == TraceContext(VALID)
    assert incoming(VALID, "bad\u00e9") == TraceContext(VALID)
    assert incoming(VALID, "  ") == TraceContext(VALID)


def test_headers_of_a_kafka_message() -> None:
    assert headers_of(None) is None
    assert headers_of([("other", b"x")]) is None
    assert headers_of([("TraceParent", VALID.encode()), ("tracestate", b"a=b")]) == (
        TraceContext(VALID, "a=b")
    )
    assert headers_of({"traceparent": VALID}) == TraceContext(VALID)


def test_tracing_and_log_settings_are_checked() -> None:
    assert not Settings.from_env({}).tracing_enabled
    assert Settings.from_env({}).log_format == "text"
    for name, value in (
        ("WFJOBS_TRACING", "yes"),
        ("WFJOBS_TRACING_EXPORTER", "jaeger"),
        ("WFJOBS_LOG_FORMAT", "xml"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter in which OpenTelemetry cannot be imported."""
    hidden = "import sys; sys.modules['opentelemetry'] = None; "
    return subprocess.run(
        [sys.executable, "-c", hidden + code],
        cwd=ROOT,
        env={**os.environ, "WFJOBS_WORKER_ID": "no-extra", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_service_starts_without_the_tracing_extra() -> None:
    loaded = _python("import streams.app; print(streams.app.app.wfjobs_runtime.tracing)")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "None"


def test_tracing_on_without_the_extra_fails_at_start_naming_it() -> None:
    refused = _python("import streams.app", WFJOBS_TRACING="on")
    assert refused.returncode != 0
    assert "WFJOBS_TRACING=on" in refused.stderr
    assert "workflow-jobs[tracing]" in refused.stderr
