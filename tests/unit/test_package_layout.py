"""The package's shape: small modules (none over 600 lines), no import cycle among them nor among its
packages, a decision core that does no I/O, and loggers named after their modules.

Imports are read from the source (``ast``), every one of them: at module level,
under ``if TYPE_CHECKING:`` and inside functions. A cycle that only type checkers
or a late call would walk is still two modules that cannot be understood, tested
or moved one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parents[2] / "cloud_elastic"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path) -> set[str]:
    """Every dotted name the module at ``path`` imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # ``from a.b import c`` imports the module a.b.c when there is one, else a name of a.b.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the most specific module each import names)."""
    modules = _modules()

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {owner(t) for t in _imported(name, path) if t.split(".")[0] == PACKAGE.name}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) for each strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the package is far too shallow for the recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_within(graph, group) for group in groups]


def _path_within(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module, staying inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_no_module_of_the_package_is_over_600_lines() -> None:
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, "over %d lines: %s" % (MAX_LINES, ", ".join(f"{p} ({n})" for p, n in sorted(long.items())))


def test_no_import_cycle_among_the_packages_modules() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_sees_type_checking_and_function_local_imports(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cloud_elastic.b import X\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from . import c\n")
    assert _imported("cloud_elastic.a", a) == {"typing.TYPE_CHECKING", "cloud_elastic.b.X"}
    assert _imported("cloud_elastic.b", b) == {"cloud_elastic.c"}
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({"p.a": {"p.b"}, "p.b": set()}) == []


def package_graph(graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """The import graph between the package's parts: a package without sub-packages is one node (its
    modules folded into it); a module directly in a package that has sub-packages is a node of its own
    (``cloud_elastic.config``, ``cloud_elastic.worker.context``), as is each package's ``__init__``."""
    graph = import_graph() if graph is None else graph
    packages = {m for m, path in _modules().items() if path.name == "__init__.py"}
    packages |= {m.rpartition(".")[0] for m in graph} - {""}

    def node(module: str) -> str:
        if module in packages:
            return module
        parent = module.rpartition(".")[0]
        return module if any(p.rpartition(".")[0] == parent for p in packages) else parent

    folded: dict[str, set[str]] = {}
    for a, targets in graph.items():
        folded.setdefault(node(a), set()).update(node(b) for b in targets)
    for n, targets in folded.items():
        targets.discard(n)
    for targets in list(folded.values()):
        for t in targets:
            folded.setdefault(t, set())
    return folded


def test_no_import_cycle_among_the_packages_parts() -> None:
    found = cycles(package_graph())
    assert not found, "package cycles: " + "; ".join(" -> ".join(c) for c in found)


#: What the driver's decision core (``driver/job``) may not import: no clock, thread, socket, process or
#: selector, and nothing of the runtime shell around it.
CORE = "cloud_elastic.driver.job"
CORE_FORBIDDEN_STDLIB = ("time", "threading", "socket", "os", "subprocess", "selectors")
CORE_FORBIDDEN_PACKAGES = tuple(f"cloud_elastic.driver.{p}" for p in ("runtime", "net", "launch", "restart"))


def test_the_decision_core_imports_no_io_and_nothing_of_the_runtime() -> None:
    found = []
    for name, path in _modules().items():
        if name != CORE and not name.startswith(CORE + "."):
            continue
        for imported in sorted(_imported(name, path)):
            top = imported.split(".")[0]
            if top in CORE_FORBIDDEN_STDLIB or any(imported == p or imported.startswith(p + ".")
                                                   for p in CORE_FORBIDDEN_PACKAGES):
                found.append(f"{name} imports {imported}")
    assert not found, "; ".join(found)


def _loggers(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each ``getLogger`` call whose name is not ``__name__``, and each log call on the
    ``logging`` module itself (the root logger)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        on_logging = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "logging"
        if name == "getLogger":
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Name) and arg.id == "__name__"):
                found.append((node.lineno, f"getLogger({ast.unparse(arg) if arg is not None else ''})"))
        elif on_logging and name in ("debug", "info", "warning", "error", "exception", "critical", "log"):
            found.append((node.lineno, f"logging.{name}(...)"))
    return found


#: The CLI configures the package's logger, ``cloud_elastic``, for the user (``--verbose``), and so does
#: ``ElasticRayExecutor.run`` for ``create_settings(verbose=True)``, the CLI's flag in Horovod's API.
LOGGER_EXCEPTIONS = {("cloud_elastic.cli", "getLogger('cloud_elastic')"),
                     ("cloud_elastic.ray.executor", "getLogger('cloud_elastic')")}


def test_every_module_logs_under_its_own_name() -> None:
    found = [f"{name}:{line} {what}" for name, path in _modules().items() for line, what in _loggers(path)
             if (name, what) not in LOGGER_EXCEPTIONS]
    assert not found, "loggers not named after their module: " + "; ".join(found)


def test_the_layout_checks_see_package_cycles_core_imports_and_stray_loggers(tmp_path: Path) -> None:
    graph = {"cloud_elastic.driver.restart.window": {"cloud_elastic.driver.runtime.condition"},
             "cloud_elastic.driver.runtime.condition": {"cloud_elastic.driver.restart.record"},
             "cloud_elastic.driver.restart.record": set()}
    assert cycles(package_graph(graph)) == [["cloud_elastic.driver.restart", "cloud_elastic.driver.runtime",
                                             "cloud_elastic.driver.restart"]]
    bad = tmp_path / "bad.py"
    bad.write_text("import logging\nlog = logging.getLogger('cloud_elastic.other')\nlogging.info('x')\n"
                   "good = logging.getLogger(__name__)\n")
    assert _loggers(bad) == [(2, "getLogger('cloud_elastic.other')"), (3, "logging.info(...)")]
    core = tmp_path / "core.py"
    core.write_text("import time\nfrom cloud_elastic.driver.net.control_server import Held\n")
    assert _imported(CORE + ".core", core) == {"time", "cloud_elastic.driver.net.control_server.Held"}
