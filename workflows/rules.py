"""CEL rules: compiling them once, checking them against the schema, running them.

Expressions are CEL, parsed and evaluated by the ``common-expression-language``
package (module ``cel``). A rule sees proto3 JSON values (see
:mod:`workflows.protojson`): ``input``, every earlier step's response under the
step's name, and in ``validate`` rules also ``response``.

The engine is dynamically typed over those JSON values, so a misspelt field
would only show at run time. Compilation therefore checks each rule against the
message types in scope, three ways:

* every identifier the expression reads must be in scope (names bound by a
  comprehension macro such as ``ids.all(x, x > 0)`` excepted);
* every member chain rooted at a scope name (``tokenize.ids``,
  ``input.meta.lang``; string literals ignored) must name fields the message
  types declare, up to the first repeated, map, scalar or free-form field;
* the rule is evaluated twice against probe values of the declared types (all
  zero, then all non-zero) to catch unknown functions, operations on operands
  of the wrong types (``input.text > 3``) and results the target field cannot
  hold. A probe that fails for data reasons (an index past the end, a division
  by zero) proves nothing and is ignored: that is the run's business. So is a
  type error of a rule reading a ``google.protobuf.Value``, whose probe stands
  for one type of the many it may hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from workflows.cel_engine import cel
from workflows.protojson import (
    DYNAMIC_TYPES,
    SPECIAL_JSON_TYPES,
    describe_value,
    descriptor_of,
    enum_type_of,
    field_type_name,
    is_map,
    message_type_of,
    pool_of,
    to_json_value,
)
from workflows.scalars import FLOAT_TYPES, INT64_TYPES, MESSAGE_TYPES, Refuse, reader_for

MAX_RULE_CHARS = 4096  # the parser recurses; very deep expressions could exhaust the stack
DEFAULT_RULE_CHARS = 1024
DEFAULT_RULE_NESTING = 3
# About a twentieth of a second of the engine's time at worst (see Rule.walks).
DEFAULT_RULE_COST = 1_000_000

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*"
_ASSIGNMENT = re.compile(rf"\s*({_PATH})\s*=(?!=)(.*)", re.DOTALL)
_CHAIN = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)+)(\s*\()?")
# CEL's string literals and comments as its lexer reads them: a raw literal
# (``r`` prefix) takes a backslash as itself, any other as an escape,
# triple-quoted ones included; ``//`` outside a literal comments out the rest of
# the line. Read any other way, a literal ends elsewhere, or a quote in a
# comment starts one, and it swallows code whose macros the nesting cap would
# then not count.
_LITERAL_OR_COMMENT = re.compile(
    r"""(?:[rR][bB]?|[bB][rR])(?:'''.*?'''|\"\"\".*?\"\"\"|'[^'\n]*'|"[^"\n]*")"""
    r"""|[bB]?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")"""
    r"""|//[^\n]*""",
    re.DOTALL,
)


def _blank_literals(expression: str) -> str:
    """``expression`` with each string literal an empty one and each comment gone."""
    return _LITERAL_OR_COMMENT.sub(
        lambda found: "" if found.group().startswith("//") else '""', expression
    )


_MEMBER_CHAIN = re.compile(r"\s*[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*\s*")
_UNDEFINED = re.compile(r"Undefined variable or function: '([^']*)'")
_BINDER_MACROS = r"(?:all|exists|exists_one|existsOne|map|filter|bind|transformList|transformMap)"
_MACRO_CALL = re.compile(rf"\.\s*{_BINDER_MACROS}\s*\(")
# The macros that build a list, which the engine copies at every element.
_LIST_BUILDER = re.compile(r"\.\s*(?:map|filter)\s*\(")


@dataclass(frozen=True, slots=True)
class RuleLimits:
    """Caps every rule must fit before it is compiled, let alone evaluated.

    Each comprehension macro (``map``, ``all``, ``filter``...) nested in another
    multiplies the work of evaluating the rule by the size of the list it walks,
    so ``max_nesting`` bounds how deep they go; ``max_chars`` bounds the size of
    everything else, list literals included.

    Evaluating holds the interpreter lock, and what a walk costs depends on
    the data it walks, which no cap on the text bounds: ``max_cost`` bounds
    the estimate :meth:`Scope.evaluate` makes from the values in scope before
    it evaluates a rule that walks lists.
    """

    max_chars: int = DEFAULT_RULE_CHARS
    max_nesting: int = DEFAULT_RULE_NESTING
    max_cost: int = DEFAULT_RULE_COST

    def __post_init__(self) -> None:
        if not 1 <= self.max_chars <= MAX_RULE_CHARS:
            raise ValueError(f"max_chars must be between 1 and {MAX_RULE_CHARS}")
        if self.max_nesting < 1:
            raise ValueError("max_nesting must be at least 1")
        if self.max_cost < 1:
            raise ValueError("max_cost must be at least 1")


DEFAULT_LIMITS = RuleLimits()


class RuleError(Exception):
    """A rule is malformed; the text says what is wrong, the caller adds where."""


class RuleTooCostly(Exception):
    """The values in scope would make a rule cost more than its limit to evaluate."""


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One compiled rule.

    ``text`` is the rule as written; ``target`` the field path a mapping rule
    assigns (empty for ``validate`` rules). ``path`` is set when the expression
    is a bare member chain over the scope (``tokenize.ids``): those are read
    straight from the JSON values, no engine round trip. ``needs`` are the
    scope names the expression reads.

    ``walks`` (0 for a rule without comprehension macros) is the power of the
    length of the lists the rule can reach that bounds its cost: each macro
    nested in another walks a list for every element of the outer one, and a
    ``map`` or ``filter`` copies the list it builds at every element, which
    adds one more (the engine's ``map`` over a thousand elements takes about
    50 ms here, over four thousand 800 ms). A rule without macros costs what
    its text and its values add up to. ``widens`` bounds how many times longer
    than the values in scope a list the rule builds can be: each ``+`` can
    join two. ``literal`` is the length of its longest list or map literal.
    """

    text: str
    expression: str
    program: cel.Program
    target: tuple[str, ...] = ()
    path: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()
    walks: int = 0
    widens: int = 1
    literal: int = 0


def make_rule(
    text: str, expression: str, scope_names: Iterable[str], target: tuple[str, ...] = ()
) -> Rule:
    """Compile ``expression`` (raising :class:`RuleError`) into a :class:`Rule`."""
    program = compile_expression(expression)
    names = set(scope_names)
    needs = tuple(name for name in program.variables() if name in names)
    path: tuple[str, ...] | None = None
    if _MEMBER_CHAIN.fullmatch(expression):
        parts = tuple(part.strip() for part in expression.split("."))
        if parts[0] in names:
            path = parts
    return Rule(text, expression, program, target, path, needs, *cost_shape(expression))


def cost_shape(expression: str) -> tuple[int, int, int]:
    """``expression``'s ``walks``, ``widens`` and ``literal`` (see :class:`Rule`)."""
    blanked = _blank_literals(expression)
    depth = macro_depth(blanked)
    walks = depth + 1 if depth and _LIST_BUILDER.search(blanked) else depth
    return walks, blanked.count("+") + 1, longest_literal(blanked) if walks else 0


def estimate_cost(elements: int, shape: tuple[int, int, int], max_cost: int) -> str | None:
    """Why a rule of ``shape`` over values of ``elements`` costs past ``max_cost``; None if not."""
    walks, widens, literal = shape
    reach = (elements + literal) * widens
    if reach**walks <= max_cost:
        return None
    return (
        f"would walk lists of up to {reach} elements (the values it reads hold "
        f"{elements}), an estimated {reach}^{walks} steps, over its limit of "
        f"{max_cost} (WFJOBS_RULE_MAX_COST)"
    )


def split_assignment(text: str) -> tuple[tuple[str, ...], str]:
    """Split ``field.path = expression``; ``==`` is never taken for the assignment."""
    match = _ASSIGNMENT.fullmatch(text)
    if match is None:
        raise RuleError("must have the form `field = expression`")
    path = tuple(part.strip() for part in match.group(1).split("."))
    expression = match.group(2).strip()
    if not expression:
        raise RuleError("has nothing to the right of `=`")
    return path, expression


def check_limits(expression: str, limits: RuleLimits) -> None:
    """Refuse a rule past ``limits``; a scan of the text, no parsing, no evaluation."""
    if len(expression) > limits.max_chars:
        raise RuleError(
            f"is {len(expression)} characters long; a rule may have at most {limits.max_chars}"
        )
    deepest = macro_depth(_blank_literals(expression))
    if deepest > limits.max_nesting:
        raise RuleError(
            f"nests comprehension macros (map, filter, all, exists...) {deepest} deep; "
            f"at most {limits.max_nesting} are allowed, since each level multiplies "
            "the work of evaluating the rule"
        )


def longest_literal(text: str) -> int:
    """The most elements of one list or map literal in ``text`` (literals blanked)."""
    longest = 0
    # Per open bracket: its kind and the commas seen directly inside it.
    open_brackets: list[list[Any]] = []
    for char in text:
        if char in "([{":
            open_brackets.append([char, 0, False])
        elif char == "," and open_brackets:
            open_brackets[-1][1] += 1
        elif char in ")]}" and open_brackets:
            kind, commas, filled = open_brackets.pop()
            if kind != "(" and filled:
                longest = max(longest, commas + 1)
        elif not char.isspace() and open_brackets:
            open_brackets[-1][2] = True
        if char in ")]}" and open_brackets:
            open_brackets[-1][2] = True
    return longest


def macro_depth(text: str) -> int:
    """How deep comprehension macros nest in ``text`` (literals and comments blanked)."""
    depth = deepest = 0
    frames: list[bool] = []  # per open parenthesis: does it open a macro's arguments?
    position = 0
    while position < len(text):
        macro = _MACRO_CALL.match(text, position)
        if macro is not None:
            frames.append(True)
            depth += 1
            deepest = max(deepest, depth)
            position = macro.end()
            continue
        char = text[position]
        if char == "(":
            frames.append(False)
        elif char == ")" and frames:
            depth -= frames.pop()
        position += 1
    return deepest


def compile_expression(expression: str) -> cel.Program:
    if not expression.strip():
        raise RuleError("is empty")
    if len(expression) > MAX_RULE_CHARS:
        raise RuleError(f"is longer than {MAX_RULE_CHARS} characters")
    try:
        return cel.compile(expression)
    except Exception as exc:
        raise RuleError(f"does not parse as CEL: {_syntax_message(exc)}") from None


def _syntax_message(exc: BaseException) -> str:
    text = str(exc)
    marker = "ERROR: <input>:"
    start = text.find(marker)
    if start >= 0:
        text = text[start + len(marker) :]
        text = "column " + text.split(":", 1)[1].strip() if ":" in text else text
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


def describe_error(exc: BaseException) -> str:
    """The engine's complaint about a failed evaluation, on one line."""
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else "?"
        return f"no field or key {key!r} in the value it selects from"
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return first if len(first) <= 300 else first[:297] + "..."


class Scope:
    """The values rules read during one segment.

    Values are proto3 JSON. Member-chain rules read them directly; the CEL
    context gets a value only when an expression needs it, converted once per
    binding, because that conversion costs about a microsecond per element.
    """

    __slots__ = ("_elements", "_stale", "context", "max_cost", "values")

    def __init__(
        self, input_value: Mapping[str, Any] | None, *, max_cost: int = DEFAULT_RULE_COST
    ) -> None:
        self.values: dict[str, Any] = {}
        self.context = cel.Context()
        self.max_cost = max_cost
        self._stale: set[str] = set()
        self._elements: dict[str, int] = {}
        if input_value is not None:
            self.bind("input", input_value)

    def bind(self, name: str, value: Any) -> None:
        self.values[name] = value
        self._stale.add(name)
        self._elements.pop(name, None)

    def evaluate(self, rule: Rule) -> Any:
        """The rule's value; member chains come back in proto3 JSON form already."""
        path = rule.path
        if path is not None:
            value = self.values[path[0]]
            for part in path[1:]:
                if type(value) is not dict:
                    raise TypeError(f"cannot select {part!r} from {describe_value(value)}")
                value = value[part]
            return value
        if rule.walks:
            self._check_cost(rule)
        stale = self._stale
        if stale:
            for name in rule.needs:
                if name in stale:
                    self.context.add_variable(name, self.values[name])
                    stale.discard(name)
        return rule.program.execute(self.context)

    def evaluate_json(self, rule: Rule) -> Any:
        """The rule's value in proto3 JSON form."""
        value = self.evaluate(rule)
        return value if rule.path is not None else to_json_value(value)

    def _check_cost(self, rule: Rule) -> None:
        """Raise :class:`RuleTooCostly` before an evaluation the limit does not allow.

        The engine cannot be stopped once it evaluates, so the bound is taken
        from what it will walk: every element of the values the rule reads
        (any of them may be one list) and its longest literal, times
        ``widens``, to the power ``walks``.
        """
        elements = 0
        for name in rule.needs:
            count = self._elements.get(name)
            if count is None:
                count = self._elements[name] = count_elements(self.values[name])
            elements += count
        problem = estimate_cost(elements, (rule.walks, rule.widens, rule.literal), self.max_cost)
        if problem is not None:
            raise RuleTooCostly(problem)


def count_elements(value: Any) -> int:
    """Every list element and object member in a JSON value, at any depth."""
    count = 0
    pending = [value]
    while pending:
        node = pending.pop()
        if type(node) is dict:
            count += len(node)
            pending.extend(node.values())
        elif type(node) is list:
            count += len(node)
            pending.extend(node)
    return count


def assign(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``path`` in a nested dict, creating the objects on the way."""
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


# --- compile-time checks -------------------------------------------------------------


class Probes:
    """Probe values of message types, memoized for one compilation."""

    def __init__(self) -> None:
        self._messages: dict[tuple[str, int], Any] = {}
        self._free_form: dict[str, bool] = {}

    def context(self, env: Mapping[str, Descriptor], variant: int) -> cel.Context:
        return cel.Context({name: self.message(desc, variant) for name, desc in env.items()})

    def message(
        self, descriptor: Descriptor, variant: int, open_types: frozenset[str] = frozenset()
    ) -> Any:
        key = (descriptor.full_name, variant)
        cached = self._messages.get(key)
        if cached is not None:
            return cached
        if descriptor.full_name in SPECIAL_JSON_TYPES:
            value = _special_probe(descriptor.full_name, variant)
        elif descriptor.full_name in open_types:
            # A recursive type: stop here; the member-chain check still covers it.
            return {}
        else:
            inner = open_types | {descriptor.full_name}
            value = {field.name: self._field(field, variant, inner) for field in descriptor.fields}
        self._messages[key] = value
        return value

    def holds_free_form(self, descriptor: Descriptor) -> bool:
        """Whether a probe of ``descriptor`` holds a ``google.protobuf.Value`` anywhere.

        That probe (null) stands for only one of the types the value may take;
        every other probe has the type each run's value has.
        """
        known = self._free_form.get(descriptor.full_name)
        if known is None:
            known = self._free_form[descriptor.full_name] = _reaches_value(descriptor, set())
        return known

    def _field(self, field: FieldDescriptor, variant: int, open_types: frozenset[str]) -> Any:
        if is_map(field):
            key_field, value_field = message_type_of(field).fields
            return {
                _map_key_probe(key_field, variant): self._single(value_field, variant, open_types)
            }
        single = self._single(field, variant, open_types)
        return [single] if field.is_repeated else single

    def _single(self, field: FieldDescriptor, variant: int, open_types: frozenset[str]) -> Any:
        kind = field.type
        if kind in MESSAGE_TYPES:
            return self.message(message_type_of(field), variant, open_types)
        if kind == FieldDescriptor.TYPE_ENUM:
            values = enum_type_of(field).values
            return values[min(variant, len(values) - 1)].name
        if kind == FieldDescriptor.TYPE_STRING:
            return "x" if variant else ""
        if kind == FieldDescriptor.TYPE_BOOL:
            return bool(variant)
        if kind == FieldDescriptor.TYPE_BYTES:
            return "eA==" if variant else ""
        if kind in FLOAT_TYPES:
            return float(variant)
        if kind in INT64_TYPES:
            return str(variant)  # proto3 JSON spells 64-bit integers as strings
        return variant


def _reaches_value(descriptor: Descriptor, seen: set[str]) -> bool:
    name = descriptor.full_name
    if name in SPECIAL_JSON_TYPES:
        # A Value's probe is null; the others' are scalars or empty, with
        # nothing inside for a rule to reach.
        return name == "google.protobuf.Value"
    seen.add(name)
    return any(
        _reaches_value(field.message_type, seen)
        for field in descriptor.fields
        if field.message_type is not None and field.message_type.full_name not in seen
    )


def _map_key_probe(field: FieldDescriptor, variant: int) -> str:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if variant else "false"
    if field.type == FieldDescriptor.TYPE_STRING:
        return "x" if variant else ""
    return str(variant)


def _special_probe(full_name: str, variant: int) -> Any:
    short = full_name.rsplit(".", 1)[1]
    probes: dict[str, Any] = {
        "Timestamp": "1970-01-01T00:00:01Z" if variant else "1970-01-01T00:00:00Z",
        "Duration": "1s" if variant else "0s",
        "FieldMask": "x" if variant else "",
        "Struct": {},
        "Value": None,
        "ListValue": [],
        "Any": {},
        "DoubleValue": float(variant),
        "FloatValue": float(variant),
        "Int64Value": str(variant),
        "UInt64Value": str(variant),
        "Int32Value": variant,
        "UInt32Value": variant,
        "BoolValue": bool(variant),
        "StringValue": "x" if variant else "",
        "BytesValue": "eA==" if variant else "",
    }
    return probes.get(short, {})


Explain = Callable[[str], str]


def check_rule(
    rule: Rule,
    env: Mapping[str, Descriptor],
    probes: Probes,
    *,
    explain_unknown: Explain,
    target_class: type[Message] | None = None,
    boolean: bool = False,
    probe: bool = True,
) -> None:
    """Check ``rule`` against the message types in scope; raise :class:`RuleError`.

    ``target_class`` is the request type a mapping rule writes into;
    ``boolean`` asks for a ``validate`` rule's boolean result. Without
    ``probe`` the rule is not evaluated: only its names and member chains are
    checked (for snapshots whose rules were probed when they were submitted).
    """
    expression = rule.expression
    for name in rule.program.variables():
        if name not in env and not _is_bound(name, expression):
            raise RuleError(explain_unknown(name))
    problem = _member_chain_problem(expression, env)
    if problem is not None:
        raise RuleError(problem)
    if not probe:
        return

    results: list[Any] = []
    for variant in (0, 1):
        try:
            results.append(rule.program.execute(probes.context(env, variant)))
        except RuntimeError as exc:
            missing = _UNDEFINED.search(str(exc))
            if missing is None:
                continue
            name = missing.group(1)
            if name in rule.program.variables():
                raise RuleError(explain_unknown(name)) from None
            raise RuleError(f"calls {name!r}, which is not a function CEL knows") from None
        except TypeError as exc:
            # The engine's "no such overload": the probes have exactly the
            # types every run's values have, so every run taking this path
            # fails the same way.
            if any(probes.holds_free_form(env[name]) for name in rule.needs):
                continue
            reason = describe_error(exc).split(". ", 1)[0].rstrip(".")
            raise RuleError(
                "applies an operation to values of types it is not defined for, so it "
                f"would fail at run time: {reason}"
            ) from None
        except Exception:
            continue  # a data-dependent failure: the probe proves nothing
    if not results:
        return
    if boolean:
        produced = [value for value in results if value is not None]
        if produced and not any(isinstance(value, bool) for value in produced):
            raise RuleError(
                f"must be a boolean expression, but it produces {describe_value(produced[0])}"
            )
    if target_class is not None:
        _check_target_type(rule, target_class, results)


def _check_target_type(rule: Rule, target_class: type[Message], results: list[Any]) -> None:
    failures: list[str] = []
    for value in results:
        try:
            converted = to_json_value(value)
        except TypeError as exc:
            failures.append(str(exc))
            continue
        data: dict[str, Any] = {}
        assign(data, rule.target, converted)
        try:
            json_format.ParseDict(
                data, target_class(), descriptor_pool=pool_of(descriptor_of(target_class))
            )
        except Exception as exc:
            failures.append(_innermost(str(exc)))
            continue
        return
    field = _resolve_target(descriptor_of(target_class), rule.target)
    kind = field_type_name(field) if field is not None else "?"
    raise RuleError(
        f"produces {describe_value(results[0])}, which field "
        f"{'.'.join(rule.target)!r} ({kind}) cannot hold: {failures[0]}"
    )


def _innermost(text: str) -> str:
    # json_format nests "Failed to parse x field: " prefixes; the last clause is the reason.
    parts = text.strip().rstrip(".").split("field: ")
    return parts[-1].strip() or text


def _resolve_target(descriptor: Descriptor, path: tuple[str, ...]) -> FieldDescriptor | None:
    field: FieldDescriptor | None = None
    current: Descriptor | None = descriptor
    for part in path:
        if current is None:
            return None
        field = current.fields_by_name.get(part)
        if field is None:
            return None
        current = field.message_type
    return field


def resolve_assignment_target(descriptor: Descriptor, path: tuple[str, ...]) -> str | None:
    """Why ``path`` cannot be assigned in ``descriptor``, or None when it can."""
    current = descriptor
    for position, part in enumerate(path):
        field = current.fields_by_name.get(part)
        walked = ".".join(path[:position]) or current.full_name
        if field is None:
            hint = _json_name_hint(current, part)
            fields = ", ".join(f.name for f in current.fields) or "no fields"
            where = current.full_name if position == 0 else f"{walked} ({current.full_name})"
            return f"{where} has no field {part!r}{hint}; its fields: {fields}"
        if position < len(path) - 1:
            if (
                field.message_type is None
                or field.is_repeated
                or field.message_type.full_name in SPECIAL_JSON_TYPES
            ):
                return (
                    f"cannot assign inside {'.'.join(path[: position + 1])!r}: "
                    f"it is {field_type_name(field)}, not a message"
                )
            current = field.message_type
    return None


def _json_name_hint(descriptor: Descriptor, name: str) -> str:
    for field in descriptor.fields:
        if field.json_name == name and field.name != name:
            return f" (did you mean {field.name!r}? rules use .proto field names)"
    return ""


def _is_bound(name: str, expression: str) -> bool:
    pattern = rf"\b{_BINDER_MACROS}\s*\(\s*(?:[A-Za-z_]\w*\s*,\s*)?{re.escape(name)}\s*,"
    return re.search(pattern, expression) is not None


def _member_chain_problem(expression: str, env: Mapping[str, Descriptor]) -> str | None:
    stripped = _blank_literals(expression)
    for match in _CHAIN.finditer(stripped):
        parts = [part.strip() for part in match.group(1).split(".")]
        if match.group(2):
            parts = parts[:-1]  # the last name is a method call, not a field
        problem = _walk(parts, env)
        if problem is not None:
            return problem
    return None


def _walk(parts: list[str], env: Mapping[str, Descriptor]) -> str | None:
    descriptor = env.get(parts[0])
    if descriptor is None:
        return None
    for position in range(1, len(parts)):
        if descriptor.full_name in DYNAMIC_TYPES or descriptor.full_name in SPECIAL_JSON_TYPES:
            return None
        name = parts[position]
        field = descriptor.fields_by_name.get(name)
        if field is None:
            walked = ".".join(parts[:position])
            fields = ", ".join(f.name for f in descriptor.fields) or "no fields"
            hint = _json_name_hint(descriptor, name)
            return (
                f"{walked} ({descriptor.full_name}) has no field {name!r}{hint}; "
                f"its fields: {fields}"
            )
        if field.is_repeated or field.message_type is None:
            return None
        descriptor = field.message_type
    return None


# --- fast request assembly -----------------------------------------------------------

Setter = Callable[[Message, Any], bool]


def make_setter(descriptor: Descriptor, path: tuple[str, ...]) -> Setter | None:
    """A direct setter for a top-level scalar (or repeated scalar) field, if there is one.

    The setter returns False, or raises, for any value it is not sure about; the
    caller then builds the request through ``json_format`` instead, which is
    the authority on proto3 JSON. It exists because that parser dominates the
    cost of a step's own work.
    """
    if len(path) != 1:
        return None
    field = descriptor.fields_by_name.get(path[0])
    if field is None or is_map(field) or field.type in MESSAGE_TYPES:
        return None
    accept = reader_for(field)
    name = field.name
    if field.is_repeated:

        def set_repeated(message: Message, value: Any) -> bool:
            if value is None:
                return True
            if type(value) is not list:
                return False
            try:
                converted = [accept(item) for item in value]
            except Refuse:
                return False
            getattr(message, name).extend(converted)
            return True

        return set_repeated

    def set_single(message: Message, value: Any) -> bool:
        if value is None:
            return True
        try:
            converted = accept(value)
        except Refuse:
            return False
        setattr(message, name, converted)
        return True

    return set_single


__all__ = [
    "DEFAULT_LIMITS",
    "MAX_RULE_CHARS",
    "Explain",
    "Probes",
    "Rule",
    "RuleError",
    "RuleLimits",
    "Scope",
    "Setter",
    "assign",
    "check_limits",
    "check_rule",
    "compile_expression",
    "describe_error",
    "make_rule",
    "make_setter",
    "resolve_assignment_target",
    "split_assignment",
]
