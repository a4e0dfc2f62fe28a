"""models.quant's layout: imports run one way, small files, the registry owns the fast path, and no
module of the kernels is configured by setting its attributes."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import models.quant
from models.quant.element_formats import ELEMENT_FORMATS
from models.quant.format_registry import FORMAT_SPECS

QUANT = Path(models.quant.__file__).parent
ROOT = QUANT.parents[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set:
    """The models.quant modules ``path`` imports anywhere (deferred imports inside functions too)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("models.quant"):
            names.add(node.module)
            for alias in node.names:  # "from models.quant import formats" names a module
                if (QUANT.parent / Path(*node.module.split(".")[1:]) / alias.name).with_suffix(".py").exists() or \
                        (QUANT.parent / Path(*node.module.split(".")[1:]) / alias.name / "__init__.py").exists():
                    names.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("models.quant"))
    return names


def _graph() -> dict:
    modules = {_module_name(path): path for path in QUANT.rglob("*.py")}
    return {name: {imported for imported in _imports(path) if imported in modules and imported != name}
            for name, path in modules.items()}


def test_no_import_circle_among_the_modules():
    graph = _graph()
    state = {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import circle: {' -> '.join(trail + [node])}"
        state[node] = "open"
        for imported in graph[node]:
            visit(imported, trail + [node])
        state[node] = "done"

    for node in graph:
        visit(node, [])


def test_the_format_layers_import_one_way():
    graph = _graph()

    def reaches(start, target):
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == target:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
        return False

    order = ["models.quant.format_registry", "models.quant.gemm_spec", "models.quant.formats",
             "models.quant.element_formats"]
    for upper, lower in zip(order, order[1:]):
        assert lower in graph[upper], f"{upper} should import {lower}"
    for index, lower in enumerate(order):
        for upper in order[:index]:
            assert not reaches(lower, upper), f"{lower} reaches back up to {upper}"
    for kernel_module in (name for name in graph if name.startswith("models.quant.kernels")):
        for upper in ("models.quant.format_registry", "models.quant.gemm_spec", "models.quant.linear"):
            assert not reaches(kernel_module, upper), f"{kernel_module} reaches up to {upper}"


def test_no_product_file_over_600_lines():
    long = {str(path.relative_to(ROOT)): n for path in QUANT.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 600}
    assert not long, long


def _string_constants_outside_docstrings(path: Path) -> set:
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_the_emulated_layer_names_no_format():
    """linear.py asks the registry which kernel quantizes an operand; no format name is written there."""
    names = set(FORMAT_SPECS) | set(ELEMENT_FORMATS)
    constants = _string_constants_outside_docstrings(QUANT / "linear.py")
    written = {constant for constant in constants for name in names if re.search(rf"\b{name}\b", constant)}
    assert not written, written


def test_every_named_quantize_kernel_offers_the_operand_interface():
    named = {spec.quantize_kernel for spec in FORMAT_SPECS.values() if spec.quantize_kernel is not None}
    assert "nvfp4" in named
    for name in named:
        module = importlib.import_module(f"models.quant.kernels.{name}")
        for function in ("operand_supported", "shared_scales", "quantize_operand"):
            assert callable(getattr(module, function, None)), f"kernels.{name} lacks {function}"
        assert getattr(importlib.import_module("models.quant.kernels"), name) is module


def test_no_kernel_module_is_configured_by_setting_its_attributes():
    """Launch configurations are options objects passed explicitly: nothing in the repository sets an
    attribute of a kernels module (setattr, monkeypatch.setattr, or an assignment to module.NAME)."""
    kernel_modules = "kernels|fp8_kernels|nvfp4|nvfp4_amax|fp8|epilogue|fp4_common|triton_common|options"
    patterns = [re.compile(rf"setattr\(\s*(?:{kernel_modules})\s*,"),
                re.compile(rf"^\s*(?:{kernel_modules})\.[A-Za-z_]\w*\s*=[^=]", re.MULTILINE),
                re.compile(rf"^\s*\w+\s*,\s*(?:{kernel_modules})\.[A-Za-z_]\w*\s*=[^=]", re.MULTILINE)]
    found = []
    for path in ROOT.rglob("*.py"):
        if ".git" in path.parts or "site-packages" in path.parts:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {match.group(0).strip()}" for pattern in patterns
                  for match in pattern.finditer(text)]
    assert not found, found
