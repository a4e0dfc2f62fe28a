"""The product packages' layout, as docs/ARCHITECTURE.md draws it: imports run down the layers,
no module imports itself back through others, and no product file is over 600 lines.

The import graph is read from the source (every import, deferred ones inside functions too), so
an import that only a rarely taken path executes counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("fileio", "models", "data", "trainer", "benchmarks", "reports", "study")
"""The product packages (scripts/ imports them all and is imported by none)."""

MAY_IMPORT = {
    "fileio": set(),
    "models": {"fileio"},
    "data": {"fileio"},
    "trainer": {"fileio", "models", "data"},
    "benchmarks": {"fileio", "models", "data", "trainer"},
    "reports": {"fileio", "models", "data", "trainer", "benchmarks"},
    "study": {"fileio", "models", "data", "trainer", "benchmarks", "reports"},
}
"""Which other packages each package may import: docs/ARCHITECTURE.md's "Nothing imports upward". No
package may import `study` (the precision study: it launches training and reads its results); only
scripts/ and the command lines do."""


def _is_command_line(module: str) -> bool:
    """A `__main__` module is a command line that `python -m` runs (reports.compare_runs' hands seed groups to
    study.report): like scripts/, it may import any package, and no product module may import it."""
    return module.rsplit(".", 1)[-1] == "__main__" and module.count(".") >= 2

MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _imports(path: Path, modules: dict) -> set[str]:
    """The product modules `path` imports: `from a.b import c` names a.b, and a.b.c when c is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in modules:
                names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in modules)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name in modules)
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_the_graph_sees_the_packages_and_their_imports():
    """The reader finds what is there: a guard against a graph that is empty and so passes everything."""
    graph = _graph()
    assert {"data.sources", "data.sources.files", "trainer.checkpoint.checkpointer", "trainer.hf.export",
            "fileio.hashing"} <= set(graph)
    assert "trainer.checkpoint.integrity" in graph["trainer.checkpoint.checkpointer"]
    assert "fileio.hashing" in graph["data.shards"]
    assert "data.sources" in graph["data.prepare"]
    assert {"study.runner", "study.definition", "study.report"} <= set(graph)
    assert "study.definition" in graph["study.runner"]


def test_a_package_init_that_imports_its_children_counts_in_the_circle_check():
    """The formats package's __init__ imports its children; were a child to import it back (`from
    models.quant.formats import elements`), that would be a circle the test reports, not one it exempts."""
    graph = _graph()
    assert "models.quant.formats.nvfp4" in graph["models.quant.formats"]
    children = [name for name in graph if name.startswith("models.quant.formats.")]
    assert children and not any("models.quant.formats" in graph[child] for child in children)


def test_no_package_imports_upward():
    upward = sorted(f"{name} imports {imported}" for name, imports in _graph().items() for imported in imports
                    if imported.split(".")[0] != name.split(".")[0] and not _is_command_line(name)
                    and imported.split(".")[0] not in MAY_IMPORT[name.split(".")[0]])
    assert not upward, upward


def test_the_command_lines_are_found_and_nothing_imports_them():
    graph = _graph()
    assert {"reports.compare_runs.__main__", "reports.gemm_report.__main__"} <= set(graph)
    assert "study.report" in graph["reports.compare_runs.__main__"]  # the exemption is used, and by these only
    importing = sorted(f"{name} imports {imported}" for name, imports in graph.items() for imported in imports
                       if _is_command_line(imported))
    assert not importing, importing


def test_no_import_circle_among_the_product_modules():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import circle: {' -> '.join(trail[trail.index(node):] + [node])}"
        state[node] = "open"
        for imported in sorted(graph[node]):
            visit(imported, trail + [node])
        state[node] = "done"

    for node in sorted(graph):
        visit(node, [])


def test_no_product_file_over_600_lines():
    long = {str(path.relative_to(ROOT)): count for path in _modules().values()
            if (count := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long
