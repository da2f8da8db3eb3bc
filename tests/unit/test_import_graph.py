"""The packages depend one way, and no module imports itself back.

The service (``schemas``, ``store``, ``workflows``, ``streams``, ``migrations``)
knows nothing of the command line (``cli``) or of the embedded stack and the
test services (``devstack``). The command line needs the wire contract; it
reaches into the service only for the settings, the migrator and the tokens of
the verbs that work from the environment, and into ``devstack`` only when
``wfjobs dev`` runs. ``devstack`` sits on the service and never on the command line.

Imports are read from the source (``ast``), including those inside functions;
imports under ``if TYPE_CHECKING:`` never run and make no cycle.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ("schemas", "store", "streams", "workflows", "migrations")
PACKAGES = (*SERVICE, "cli", "devstack")
# What a cli module may import at its top: itself and the wire contract.
CLI_EAGER = {"cli", "schemas"}
# What a cli command may import inside its function, when it runs.
CLI_LAZY = {
    "streams.settings",
    "store.databases",
    "store.errors",
    "store.migrate",
    "store.tokens",
    "streams.auth",
    "devstack.stack",
}
# The one place the command line starts the embedded stack.
DEV_COMMAND = ("cli.main", "_dev_stack")
DEVSTACK_USES = {"devstack", "streams", "store", "workflows", "schemas", "migrations"}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    # The innermost function the import statement is in ("" at module level).
    function: str
    # Under ``if TYPE_CHECKING:``: read by type checkers, never executed.
    typing_only: bool

    @property
    def lazy(self) -> bool:
        return bool(self.function)

    def __str__(self) -> str:
        where = f" in {self.function}()" if self.function else ""
        return f"{self.source}:{self.line}{where} imports {self.target}"


def _package(module: str) -> str:
    return module.partition(".")[0]


@functools.cache
def _modules() -> Mapping[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _project_module(name: str) -> str | None:
    """The project module ``name`` loads: itself, else its nearest known parent."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


class _Reader(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        # Relative imports count from the package a module is in.
        self.package = module.split(".") if is_package else module.split(".")[:-1]
        self.functions: list[str] = []
        self.typing_only = False
        self.found: list[Import] = []

    def _add(self, name: str, line: int) -> None:
        target = _project_module(name)
        if target is not None and target != self.module:
            function = self.functions[-1] if self.functions else ""
            self.found.append(Import(self.module, target, line, function, self.typing_only))

    def _in_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = _in_function
    visit_AsyncFunctionDef = _in_function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        if not checking:
            self.generic_visit(node)
            return
        outer, self.typing_only = self.typing_only, True
        for statement in node.body:
            self.visit(statement)
        self.typing_only = outer
        for statement in node.orelse:
            self.visit(statement)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package[: len(self.package) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            self._add(submodule if submodule in _modules() else origin, node.lineno)


@functools.cache
def _imports() -> tuple[Import, ...]:
    found: list[Import] = []
    for module, path in _modules().items():
        reader = _Reader(module, path.name == "__init__.py")
        reader.visit(ast.parse(path.read_text(), filename=str(path)))
        found.extend(reader.found)
    return tuple(found)


def _cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _runtime_imports() -> list[Import]:
    return [found for found in _imports() if not found.typing_only]


def test_the_reader_sees_eager_lazy_and_relative_imports() -> None:
    imports = set(_imports())
    assert any(i.source == "devstack.stack" and i.target == "devstack.processes" for i in imports)
    dev = [i for i in imports if i.source == "cli.main" and _package(i.target) == "devstack"]
    assert dev and all(i.lazy for i in dev)
    assert any(i.source == "cli.main" and i.target == "cli.render" and not i.lazy for i in imports)


def test_no_module_is_part_of_an_import_cycle() -> None:
    imports = _runtime_imports()
    loops = [
        [str(i) for i in imports if i.source in group and i.target in group]
        for group in _cycles((i.source, i.target) for i in imports)
    ]
    assert loops == [], "modules that import each other, directly or around a loop"


def test_no_package_is_part_of_an_import_cycle() -> None:
    imports = [i for i in _runtime_imports() if _package(i.source) != _package(i.target)]
    loops = [
        [str(i) for i in imports if {_package(i.source), _package(i.target)} <= set(group)]
        for group in _cycles((_package(i.source), _package(i.target)) for i in imports)
    ]
    assert loops == [], "packages that import each other, directly or around a loop"


def test_the_service_imports_neither_the_command_line_nor_devstack() -> None:
    upward = [
        str(i)
        for i in _imports()
        if _package(i.source) in SERVICE and _package(i.target) in {"cli", "devstack"}
    ]
    assert upward == []


def test_the_command_line_needs_the_contract_and_the_rest_only_when_a_command_runs() -> None:
    wrong: list[str] = []
    for found in _imports():
        if _package(found.source) != "cli" or _package(found.target) in CLI_EAGER:
            continue
        if found.target not in CLI_LAZY or not (found.lazy or found.typing_only):
            wrong.append(str(found))
        elif _package(found.target) == "devstack" and (found.source, found.function) != DEV_COMMAND:
            wrong.append(f"{found} (only `wfjobs dev` starts the embedded stack)")
    assert wrong == []


def test_devstack_sits_on_the_service_and_never_on_the_command_line() -> None:
    wrong = [
        str(i)
        for i in _imports()
        if _package(i.source) == "devstack" and _package(i.target) not in DEVSTACK_USES
    ]
    assert wrong == []
