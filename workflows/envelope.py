"""The definition envelope: its shape, checked key by key, and its hash.

The envelope (keys are camelCase; anything else is refused, not ignored)::

    {
      "name": "embed-text",
      "schema": {"descriptorSetBase64": "<base64 FileDescriptorSet>"},
      "inputType": "jobs.test.Text",
      "steps": [
        {"name": "tokenize", "target": "127.0.0.1:50051",
         "method": "jobs.test.Tokenizer/Tokenize", "rules": ["text = input.text"]},
        {"name": "review", "method": "jobs.test.ReviewDesk/Review",
         "rules": ["text = input.text"], "completion": "external",
         "validate": ["response.approved"]}
      ],
      "output": ["ids = tokenize.ids", "approved = review.approved"],
      "deadlineMs": 30000,
      "jobDeadlineMs": 86400000
    }

An external step may also carry ``timeoutMs`` (how long the job may wait for
its completion once parked) and, with it, ``fallback``: the response the step
takes when that time passes, instead of failing the job.

``workflows/README.md`` documents every key. The checks here are the ones that
need no descriptor set: unknown keys, required keys, names, the deadline,
targets, rule lists. ``workflows.compiler`` calls them in envelope order while it
resolves types and compiles rules. Every error names where it is
(``steps[1] 'embed', rules[0] `ids = tokenize.idz```) and what is wrong.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from schemas.errors import InvalidArgument
from schemas.names import WORKFLOW_NAME_FORM, WORKFLOW_NAME_PATTERN
from workflows.protojson import describe_value

DEFAULT_DEADLINE_MS = 30_000
MAX_DEADLINE_MS = 24 * 60 * 60 * 1000
# A whole-job deadline or an external step's timeout: at most a year, as the
# submit request's own ``deadline_ms`` allows.
MAX_WAIT_MS = 365 * 24 * 60 * 60 * 1000
MAX_STEPS = 64
MAX_RULES = 256
MAX_NAME_CHARS = 200
EXTERNAL = "external"
LOCAL_TARGET = "local"

TOP_KEYS = frozenset(
    {"name", "schema", "inputType", "steps", "output", "deadlineMs", "jobDeadlineMs"}
)
SCHEMA_KEYS = frozenset({"descriptorSetBase64"})
STEP_KEYS = frozenset(
    {"name", "target", "method", "rules", "completion", "validate", "timeoutMs", "fallback"}
)
_STEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_HOST_PORT = re.compile(
    r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})"
)
# Names gRPC reads as a resolver scheme rather than a host: ``unix:443`` is a
# socket file named "443", ``unix-abstract:443`` an abstract socket.
GRPC_SCHEMES = frozenset(
    {"dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock", "xds", "google-c2p"}
)
# CEL's reserved words, plus the two scope names the engine binds itself.
RESERVED_NAMES = frozenset(
    {
        "input",
        "response",
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    }
)


class DefinitionError(InvalidArgument):
    """A workflow definition is malformed. ``path`` locates the offending part."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


def definition_hash(envelope: Any) -> str:
    """SHA-256 of the envelope's canonical JSON (sorted keys, no whitespace)."""
    try:
        canonical = json.dumps(
            envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise DefinitionError(f"a workflow definition must be plain JSON: {exc}") from None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def only_keys(value: Mapping[Any, Any], allowed: frozenset[str], where: str, path: str) -> None:
    for key in value:
        if key in allowed:
            continue
        hint = _suggest(key, allowed)
        raise DefinitionError(
            f"{where}: unknown key {key!r}{hint}; allowed keys: {', '.join(sorted(allowed))}",
            path=f"{path}.{key}" if path else str(key),
        )


def _suggest(key: Any, allowed: frozenset[str]) -> str:
    if not isinstance(key, str):
        return ""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
    if camel in allowed:
        return f" (did you mean {camel!r}? keys are camelCase)"
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def required(value: Mapping[Any, Any], key: str, where: str, path: str) -> Any:
    if key not in value or value[key] is None:
        raise DefinitionError(
            f"{where}: {key!r} is required", path=f"{path}.{key}" if path else key
        )
    return value[key]


def parse_name(envelope: Mapping[Any, Any]) -> str:
    name = required(envelope, "name", "definition", "")
    if not isinstance(name, str) or not name.strip():
        raise DefinitionError(
            f"name: must be a non-blank string, got {describe_value(name)}", path="name"
        )
    if len(name) > MAX_NAME_CHARS:
        raise DefinitionError(
            f"name: at most {MAX_NAME_CHARS} characters, got {len(name)}", path="name"
        )
    if not WORKFLOW_NAME_PATTERN.fullmatch(name):
        # A job records its workflow's name, and the store takes no other form.
        raise DefinitionError(f"name: {name!r} is malformed: use {WORKFLOW_NAME_FORM}", path="name")
    return name


def _whole_ms(value: Any, key: str, path: str, maximum: int) -> int:
    whole: int | None = None
    if isinstance(value, bool):
        whole = None
    elif isinstance(value, int):
        whole = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        whole = int(value)  # JSON that went through a protobuf Struct carries doubles
    if whole is None:
        raise DefinitionError(
            f"{key}: must be a whole number of milliseconds, got {describe_value(value)}",
            path=path,
        )
    if not 1 <= whole <= maximum:
        raise DefinitionError(f"{key}: must be between 1 and {maximum}, got {whole}", path=path)
    return whole


def parse_deadline(value: Any) -> int:
    if value is None:
        return DEFAULT_DEADLINE_MS
    return _whole_ms(value, "deadlineMs", "deadlineMs", MAX_DEADLINE_MS)


def parse_job_deadline(value: Any) -> int | None:
    """``jobDeadlineMs``: the whole-job deadline a submit takes unless it names its own."""
    if value is None:
        return None
    return _whole_ms(value, "jobDeadlineMs", "jobDeadlineMs", MAX_WAIT_MS)


def parse_step_timeout(raw: Mapping[Any, Any], external: bool, where: str, path: str) -> int | None:
    """An external step's ``timeoutMs``; ``fallback`` needs one (its type is the compiler's)."""
    value = raw.get("timeoutMs")
    if value is None:
        if raw.get("fallback") is not None:
            raise DefinitionError(
                f"{where}.fallback: a fallback is taken when timeoutMs passes; set timeoutMs",
                path=f"{path}.fallback",
            )
        return None
    if not external:
        raise DefinitionError(
            f'{where}.timeoutMs: only a step with completion "external" waits, so only it '
            "takes a timeout (deadlineMs bounds the others)",
            path=f"{path}.timeoutMs",
        )
    return _whole_ms(value, f"{where}.timeoutMs", f"{path}.timeoutMs", MAX_WAIT_MS)


def step_names(raw_steps: list[Any]) -> list[str]:
    names: list[str] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_steps):
        where = f"steps[{index}]"
        if not isinstance(raw, Mapping):
            raise DefinitionError(
                f"{where}: must be an object, got {describe_value(raw)}", path=where
            )
        name = raw.get("name")
        if name is None:
            raise DefinitionError(f"{where}: 'name' is required", path=f"{where}.name")
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            raise DefinitionError(
                f"{where}.name: {name!r} cannot be used in rules; a step name is 1-64 letters, "
                "digits or _ and does not start with a digit",
                path=f"{where}.name",
            )
        if name in RESERVED_NAMES:
            raise DefinitionError(
                f"{where}.name: {name!r} is reserved; rules use it for something else",
                path=f"{where}.name",
            )
        if name in seen:
            raise DefinitionError(
                f"{where}.name: duplicate step name {name!r} (also steps[{seen[name]}])",
                path=f"{where}.name",
            )
        seen[name] = index
        names.append(name)
    return names


def rule_texts(value: Any, where: str, path: str) -> list[str]:
    """The rule strings under one key; ``where`` names it for people, ``path`` for tools."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionError(
            f"{where}: must be a list of strings, got {describe_value(value)}", path=path
        )
    if len(value) > MAX_RULES:
        raise DefinitionError(f"{where}: at most {MAX_RULES} rules, got {len(value)}", path=path)
    for position, text in enumerate(value):
        if not isinstance(text, str):
            raise DefinitionError(
                f"{where}[{position}]: a rule must be a string, got {describe_value(text)}",
                path=f"{path}[{position}]",
            )
    return list(value)


def parse_target(value: Any, where: str, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DefinitionError(
            f"{where}.target: must be a string, got {describe_value(value)}", path=f"{path}.target"
        )
    if value == LOCAL_TARGET:
        return value
    problem = host_port_problem(value)
    if problem is not None:
        raise DefinitionError(f"{where}.target: {problem}", path=f"{path}.target")
    return value


def host_port_problem(target: str) -> str | None:
    """Why ``target`` is not a plain ``host:port`` a step may call, or None."""
    match = _HOST_PORT.fullmatch(target)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        return f"{target!r} is neither host:port nor {LOCAL_TARGET!r} (an in-process handler)"
    if match.group(1).lower() in GRPC_SCHEMES:
        return (
            f"{target!r} is not host:port: gRPC reads {match.group(1)!r} as a resolver scheme, "
            "not a host"
        )
    return None


def descriptor_set_base64(envelope: Mapping[Any, Any]) -> Any:
    """The ``schema`` object's one key, its shape checked; decoding it is the compiler's."""
    schema_value = required(envelope, "schema", "definition", "")
    if not isinstance(schema_value, Mapping):
        got = describe_value(schema_value)
        raise DefinitionError(
            f"schema: must be an object with descriptorSetBase64, got {got}", path="schema"
        )
    only_keys(schema_value, SCHEMA_KEYS, "schema", "schema")
    return required(schema_value, "descriptorSetBase64", "schema", "schema")


def raw_steps(envelope: Mapping[Any, Any]) -> list[Any]:
    """The ``steps`` list: present, not empty, not too long; each step is checked later."""
    steps = required(envelope, "steps", "definition", "")
    if not isinstance(steps, list) or not steps:
        raise DefinitionError(
            f"steps: must be a non-empty list of steps, got {describe_value(steps)}",
            path="steps",
        )
    if len(steps) > MAX_STEPS:
        raise DefinitionError(f"steps: at most {MAX_STEPS} steps, got {len(steps)}", path="steps")
    return steps


def is_external(value: Any, where: str, path: str) -> bool:
    """A step's ``completion``: absent, or ``"external"`` (a step the job parks on)."""
    if value is not None and value != EXTERNAL:
        raise DefinitionError(
            f'{where}.completion: the only completion is "external", got {describe_value(value)}',
            path=f"{path}.completion",
        )
    return value is not None
