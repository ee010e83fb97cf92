"""The server's structure: no import circles, and no module using another's private names.

Both checks read the source (``ast``), so they see every module, including those whose
optional dependencies (``flwr``, ``ray``) are not installed.

Import circles
    The graph has one node per module of ``server/`` (``geofl.server.*``; a package is its
    ``__init__``).  Edges are the imports that run: module-level ones, those in class
    bodies and ``try``/``if`` blocks, and the lazy ones inside functions (they run on the
    first call, which can still be during an import).  Imports under ``if TYPE_CHECKING:``
    never run, nor do those under ``if __name__ == "__main__":`` when the module is
    imported: both are left out.  ``importlib.import_module("literal")`` is an import; a
    name built at run time (the lazy ``__getattr__`` of a package ``__init__``) is not seen.

    ``from geofl.server.a import b`` is an edge to ``geofl.server.a.b`` when that is a
    module, else to ``geofl.server.a``.  Importing ``geofl.server.a.b`` first runs
    ``geofl.server.a/__init__.py``, so it is also an edge to the package ``geofl.server.a``,
    but only to packages that do not contain the importing module: those are already being
    imported, and a submodule importing a sibling while its package's ``__init__`` runs is
    how packages work, not a circle.  Nothing further is implied: the package's own imports
    are that package's edges.  (A package whose ``__init__`` imports nothing has no edges
    of its own, so the edge to it can never close a circle.)

    Circles are the strongly connected components of the graph (Tarjan).  The one allowance
    is :data:`ALLOWED_LAZY_EDGES`: lazy imports of a module that brings in an optional
    dependency (it imports ``flwr``/``ray``, itself or through its top-level imports),
    listed one by one.  They are dropped before the search.  A listed edge that no longer
    exists, is no longer lazy, has no ``flwr``/``ray`` behind it or closes no circle fails,
    so the list only shrinks.

Private names
    A private name starts with one underscore (``_x``, ``__x``; dunders are public).  A
    module may use ``obj._x`` when ``_x`` is its own: a function, method or class it
    defines, a name it assigns (``_x = ...``, a dataclass field ``_x: int``, ``for _x in``),
    an attribute it assigns on ``self``/``cls``, or an import alias.  Any other ``obj._x``
    (and ``getattr(obj, "_x")``) reaches into another module's private name, as does
    ``from m import _x`` and importing a private module (``pkg._mod``) from outside
    ``pkg``, under ``if TYPE_CHECKING:`` too.  ``self._x``, ``cls._x`` and ``super()._x``
    are the class's own business.  The public API of named tuples (``_replace``,
    ``_asdict``, ...) is public by contract.  The exceptions are :data:`ALLOWED_PRIVATE`,
    each with its reason.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
PACKAGE = "geofl.server"

# ---------------------------------------------------------------------------------------
# Allowances.  Keep these short; each entry says why.
# ---------------------------------------------------------------------------------------

# (importer, imported) edges that may close a circle: lazy imports (inside a function) of
# a module behind which ``flwr``/``ray`` is imported, so that they are imported only when
# used.
ALLOWED_LAZY_EDGES: dict[tuple[str, str], str] = {
    # ``make_backend("ray")``; ray_backend subclasses backends.Backend.
    ("geofl.server.simulation.backends", "geofl.server.simulation.ray_backend"): "ray",
}

# (module, private name) pairs the module may use although they are not its own.
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {}

# Methods and attributes of ``collections.namedtuple``/``typing.NamedTuple``: public API,
# underscored only so as not to clash with field names.
NAMEDTUPLE_API = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})

OPTIONAL_DEPENDENCIES = ("flwr", "ray")


# ---------------------------------------------------------------------------------------
# Reading the source
# ---------------------------------------------------------------------------------------


def _module_of(path: Path, root: Path = SERVER, package: str = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _sources(root: Path = SERVER, package: str = PACKAGE) -> dict[str, str]:
    """Module name -> source text of every module under ``root``."""
    return {_module_of(p, root, package): p.read_text() for p in sorted(root.rglob("*.py"))}


def _packages(root: Path = SERVER, package: str = PACKAGE) -> set[str]:
    return {_module_of(p, root, package) for p in root.rglob("__init__.py")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"``: the module run as a script, never when imported."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _import_module_literal(node: ast.Call) -> str | None:
    """The literal name in ``importlib.import_module("...")``/``import_module("...")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "import_module" or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


@dataclass(frozen=True)
class _Import:
    """One imported name as written: ``from base import name`` or ``import base``."""

    base: str  # absolute module named by the statement
    name: str | None  # the imported name of ``from base import name``; None for ``import``
    line: int
    lazy: bool  # inside a function: runs when the function is first called


def _resolve_relative(module: str, is_package: bool, level: int, base: str | None) -> str:
    parts = module.split(".")
    if not is_package:
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, base] if base else parts)


class _ImportCollector(ast.NodeVisitor):
    """The imports of one module that run, with whether they are lazy."""

    def __init__(self, module: str, is_package: bool, *, unrun: bool = False) -> None:
        self.module = module
        self.is_package = is_package
        self.unrun = unrun  # also the TYPE_CHECKING and ``__main__`` imports
        self.found: list[_Import] = []
        self._functions = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        # Decorators and defaults run at definition time, the body when called.
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._functions += 1
        for statement in node.body if not isinstance(node, ast.Lambda) else [node.body]:
            self.visit(statement)
        self._functions -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node)

    def visit_If(self, node: ast.If) -> None:
        if not self.unrun and (_is_type_checking(node.test) or _is_main_guard(node.test)):
            self.visit(node.test)
            for statement in node.orelse:  # ``else:`` runs
                self.visit(statement)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        lazy = self._functions > 0
        self.found.extend(_Import(a.name, None, node.lineno, lazy) for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            base = _resolve_relative(self.module, self.is_package, node.level, node.module)
        lazy = self._functions > 0
        self.found.extend(_Import(base, a.name, node.lineno, lazy) for a in node.names)

    def visit_Call(self, node: ast.Call) -> None:
        name = _import_module_literal(node)
        if name is not None:
            self.found.append(_Import(name, None, node.lineno, self._functions > 0))
        self.generic_visit(node)


def _imports(
    module: str, tree: ast.Module, is_package: bool, *, unrun: bool = False
) -> list[_Import]:
    collector = _ImportCollector(module, is_package, unrun=unrun)
    collector.visit(tree)
    return collector.found


def _optional_importers(sources: Mapping[str, str], edges: list[Edge]) -> set[str]:
    """Modules that import ``flwr``/``ray`` when run, themselves or through top-level imports.

    A lazy import of one of these keeps the optional dependency out until it is needed.
    """
    found = set()
    for module, text in sources.items():
        imports = _imports(module, ast.parse(text), is_package=False)
        if any(i.base.split(".")[0] in OPTIONAL_DEPENDENCIES for i in imports):
            found.add(module)
    eager = [e for e in edges if not e.lazy]
    while True:
        more = {e.source for e in eager if e.target in found} - found
        if not more:
            return found
        found |= more


# ---------------------------------------------------------------------------------------
# The import graph and its circles
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool

    def __str__(self) -> str:
        kind = "lazy" if self.lazy else "top"
        return f"{self.source} -> {self.target}  (line {self.line}, {kind})"


def _longest_module_prefix(name: str, modules: set[str]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _edges(sources: Mapping[str, str], packages: set[str]) -> list[Edge]:
    modules = set(sources)
    edges: dict[Edge, None] = {}  # ordered and without repeats
    for module, text in sources.items():
        tree = ast.parse(text, filename=module)
        own_packages = {module} | {p for p in packages if module.startswith(p + ".")}
        for item in _imports(module, tree, module in packages):
            target: str | None = f"{item.base}.{item.name}"
            if item.name is None or target not in modules:
                target = _longest_module_prefix(item.base, modules)
            if target is None or target == module:
                continue
            # The packages whose __init__ runs first, unless this module is inside them.
            implied = [p for p in packages if target.startswith(p + ".") and p not in own_packages]
            for reached in [target, *implied]:
                edges[Edge(module, reached, item.line, item.lazy)] = None
    return list(edges)


def _graph(edges: list[Edge]) -> dict[str, dict[str, list[Edge]]]:
    """source -> target -> the edges (imports) between them."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, []).append(edge)
        graph.setdefault(edge.target, {})
    return graph


def _strongly_connected(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(components)


def _shortest_circle(graph: Mapping[str, Mapping[str, object]], start: str) -> list[str]:
    """The shortest path start -> ... -> start (breadth first)."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return []


def _circles(
    edges: list[Edge], allowed: Mapping[tuple[str, str], str] = ALLOWED_LAZY_EDGES
) -> list[str]:
    """One readable report per import circle, the allowed edges left out."""
    graph = _graph([e for e in edges if (e.source, e.target) not in allowed])
    reports = []
    for component in _strongly_connected(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        circle = _shortest_circle(graph, component[0])
        inside = [
            str(edge)
            for source in component
            for target, found in sorted(graph[source].items())
            if target in members
            for edge in found
        ]
        reports.append(
            f"circle among {len(component)} module(s): {' -> '.join(circle)}\n"
            "  imports inside it:\n    " + "\n    ".join(inside)
        )
    return reports


# ---------------------------------------------------------------------------------------
# Private names
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivateUse:
    module: str
    name: str
    line: int
    expression: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.expression}"


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines: what it may use as ``obj._x``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)  # assignments, dataclass fields, loop/with/walrus targets
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _is_own_object(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def _private_uses(
    module: str, tree: ast.Module, is_package: bool, modules: set[str] | None = None
) -> Iterator[PrivateUse]:
    """Where ``module`` uses a private name that is not its own."""
    own = _own_names(tree)
    modules = modules or set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if node.attr in own or node.attr in NAMEDTUPLE_API or _is_own_object(node.value):
                continue
            yield PrivateUse(module, node.attr, node.lineno, ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and node.args[1].value not in own
            and not _is_own_object(node.args[0])
        ):
            yield PrivateUse(module, node.args[1].value, node.lineno, ast.unparse(node))
    for item in _imports(module, tree, is_package, unrun=True):  # type-only ones too
        written = f"from {item.base} import {item.name}" if item.name else f"import {item.base}"
        parts = item.base.split(".")
        if item.name is not None:
            if f"{item.base}.{item.name}" in modules:
                parts.append(item.name)  # a module: judged as one below
            elif _is_private(item.name):
                if _longest_module_prefix(item.base, modules) != module:
                    yield PrivateUse(module, item.name, item.line, written)
                continue
        # A private module ``pkg._mod`` (and what is in it) is ``pkg``'s own; a top-level
        # one (``_thread``) is nobody's.
        for depth, part in enumerate(parts[1:], start=1):
            if _is_private(part):
                owner = ".".join(parts[:depth])
                if module != owner and not module.startswith(owner + "."):
                    yield PrivateUse(module, part, item.line, written)
                break


def _all_private_uses(sources: Mapping[str, str], packages: set[str]) -> list[PrivateUse]:
    modules = set(sources)
    found: list[PrivateUse] = []
    for module, text in sources.items():
        tree = ast.parse(text, filename=module)
        found.extend(_private_uses(module, tree, module in packages, modules))
    return found


# ---------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------


def _server_edges() -> list[Edge]:
    return _edges(_sources(), _packages())


def test_server_has_no_import_circles() -> None:
    circles = _circles(_server_edges())
    assert not circles, "import circles in server/:\n" + "\n".join(circles)


def test_allowed_lazy_edges_are_lazy_imports_around_optional_dependencies() -> None:
    edges = _server_edges()
    graph = _graph(edges)
    optional = _optional_importers(_sources(), edges)
    for source, target in ALLOWED_LAZY_EDGES:
        found = graph.get(source, {}).get(target, [])
        assert found, f"stale allowance: {source} no longer imports {target}"
        eager = [str(e) for e in found if not e.lazy]
        assert not eager, f"allowed edge {source} -> {target} is not lazy: {eager}"
        assert target in optional, f"allowed edge {source} -> {target}: no flwr or ray behind it"
        component = next(c for c in _strongly_connected(graph) if source in c)
        assert target in component, f"allowed edge {source} -> {target} closes no circle"


def test_import_circle_checker_catches_a_circle() -> None:
    sources = {
        "pkg": "",
        "pkg.a": "from pkg.b import thing\n",
        "pkg.b": "def f():\n    from pkg import a\n",
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "pkg.d": "import pkg.c\n",
        "pkg.e": "import pkg.d\nif __name__ == '__main__':\n    import pkg.e\n",
    }
    edges = _edges(sources, {"pkg"})
    circles = _circles(edges, allowed={})
    assert len(circles) == 1
    assert "pkg.a -> pkg.b -> pkg.a" in circles[0]
    assert "pkg.b -> pkg.a  (line 2, lazy)" in circles[0]
    assert "pkg.c" not in circles[0]  # TYPE_CHECKING imports never run
    assert ("pkg.e", "pkg.e") not in {(e.source, e.target) for e in edges}  # a script's own
    assert _circles(edges, allowed={("pkg.b", "pkg.a"): "test"}) == []


def test_optional_importers_include_eager_importers_only() -> None:
    sources = {
        "pkg": "",
        "pkg.bridge": "def f():\n    import flwr\n",
        "pkg.front": "from pkg.bridge import f\n",
        "pkg.lazy": "def g():\n    from pkg.front import f\n",
        "pkg.plain": "import json\n",
    }
    edges = _edges(sources, {"pkg"})
    assert _optional_importers(sources, edges) == {"pkg.bridge", "pkg.front"}


def test_import_circle_checker_follows_package_inits() -> None:
    sources = {
        "pkg": "",
        "pkg.sub": "from pkg.sub.one import x\n",
        "pkg.sub.one": "x = 1\n",
        "pkg.sub.two": "from pkg.sub.one import x\n",  # sibling while sub runs: fine
        "pkg.other": "import pkg.sub.one\n",  # runs pkg/sub/__init__ too
        "pkg.sub.three": "from pkg.other import y\n",
    }
    edges = {(e.source, e.target) for e in _edges(sources, {"pkg", "pkg.sub"})}
    assert ("pkg.other", "pkg.sub") in edges
    assert ("pkg.sub.two", "pkg.sub") not in edges
    assert ("pkg.sub.three", "pkg") not in edges
    assert _circles(_edges(sources, {"pkg", "pkg.sub"}), allowed={}) == []
    sources["pkg.sub"] += "from pkg.sub.three import z\n"
    circles = _circles(_edges(sources, {"pkg", "pkg.sub"}), allowed={})
    assert len(circles) == 1
    assert "pkg.other -> pkg.sub -> pkg.sub.three -> pkg.other" in circles[0]


def test_server_uses_no_other_modules_private_names() -> None:
    found = _all_private_uses(_sources(), _packages())
    bad = [str(use) for use in found if (use.module, use.name) not in ALLOWED_PRIVATE]
    assert not bad, "private names used outside their module:\n" + "\n".join(bad)


def test_allowed_private_uses_still_exist() -> None:
    found = {(use.module, use.name) for use in _all_private_uses(_sources(), _packages())}
    stale = sorted(set(ALLOWED_PRIVATE) - found)
    assert not stale, f"stale ALLOWED_PRIVATE entries: {stale}"


def test_private_checker_catches_a_violation() -> None:
    source = (
        "import numpy as np\n"
        "from geofl.server.nodes.registry import _Entry\n"
        "from geofl.server.strategies import _numeric\n"
        "from geofl.server.strategies._flower_bridge import bridge\n"
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Own:\n"
        "    _field: int = 0\n"
        "    def __init__(self) -> None:\n"
        "        self._state = 1\n"
        "        super()._setup()\n"
        "    def _helper(self) -> int:\n"
        "        return self._other\n"
        "_table = {}\n"
        "def f(other, row, loop):\n"
        "    other._state, other._field, other._helper(), _table\n"
        "    row._replace(a=1), row._asdict(), other.__dict__, type(other).__name__\n"
        "    loop._selector\n"
        "    getattr(other, '_hidden')\n"
        "    np._core\n"
        "if TYPE_CHECKING:\n"
        "    from geofl.server.rounds.sync import _Plan\n"
    )
    modules = {
        "geofl.server.nodes.registry",
        "geofl.server.strategies._numeric",
        "geofl.server.strategies._flower_bridge",
        "geofl.server.strategies.flower",
    }
    found = sorted(
        (use.line, use.name)
        for use in _private_uses("geofl.server.x", ast.parse(source), False, modules)
    )
    assert found == [
        (2, "_Entry"),
        (3, "_numeric"),
        (4, "_flower_bridge"),
        (18, "_selector"),
        (19, "_hidden"),
        (20, "_core"),
        (22, "_Plan"),
    ]
    # Inside its own package a private module is fine.
    inside = list(
        _private_uses(
            "geofl.server.strategies.flower",
            ast.parse("from geofl.server.strategies._flower_bridge import bridge\n"),
            False,
            modules,
        )
    )
    assert inside == []
