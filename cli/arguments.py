"""Values read from the command line: JSON objects, UUIDs, names that must not be empty."""

from __future__ import annotations

import argparse
import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any

from cli.errors import CliError


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} does not fit a double")
    return value


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds above zero. The Kafka client
    takes the delivery timeout in whole milliseconds, where 0 means forever; a
    NaN deadline is never reached."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0.001:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def positive_count(text: str) -> int:
    """An argparse ``type``: a whole number above zero. A count of 0 would stop
    before anything is read and exit as if nothing had been there."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def json_object(raw: str, what: str) -> dict[str, Any]:
    """A JSON object from the command line: inline text, ``@path``, or ``-`` for stdin."""
    if raw == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise CliError(
                "INVALID_ARGUMENT", f"{what}: stdin is not UTF-8 text: {exc.reason}"
            ) from None
    elif raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError("INVALID_ARGUMENT", f"{what}: cannot read {raw[1:]}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise CliError(
                "INVALID_ARGUMENT", f"{what}: {raw[1:]} is not UTF-8 text: {exc.reason}"
            ) from None
    else:
        text = raw
    try:
        # Python's parser takes NaN and Infinity, and 1e400 as infinity; the
        # service refuses all three, so they are refused here before any call.
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:
        raise CliError("INVALID_ARGUMENT", f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        # The service takes far less nesting than the parser does.
        raise CliError("INVALID_ARGUMENT", f"{what} is nested too deeply to parse") from None
    if not isinstance(value, dict):
        raise CliError("INVALID_ARGUMENT", f"{what} must be a JSON object")
    return value


def required(value: str, argument: str) -> str:
    """A positional argument or option that must not be empty: an empty one would
    name no resource, and the server would only answer that the path is unknown."""
    if not value.strip():
        raise CliError("INVALID_ARGUMENT", f"{argument} must not be empty")
    return value


def job_id_argument(value: str | None) -> str:
    """``--job-id``, or a new id when the option is left out. An empty one is
    refused: a script's unset variable would otherwise make a new job per retry."""
    if value is None:
        return str(uuid.uuid4())
    return uuid_argument(value, "job id")


def uuid_argument(value: str, argument: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise CliError("INVALID_ARGUMENT", f"{argument} must be a UUID, got {value!r}") from None
