"""Triton jit helpers are imported under their own names (a CPU check of the kernel sources).

Inside torch.compile, Inductor compiles a user Triton kernel from source: it splices the source
of each jit helper the kernel calls, which defines the helper under its ``__name__``. A helper
imported under an alias (``import abs_nan_to_inf as _abs_nan_to_inf``) leaves the compiled
kernel calling an undefined name, and every compiled NVFP4 model fails in Inductor's compile
worker while eager runs pass. The GPU test that runs a compiled QuantLinear is
``test_quant_linear_compiled_with_inductor_matches_eager``; this one needs no Triton.
"""

from __future__ import annotations

import ast
from pathlib import Path

import models.quant

QUANT = Path(models.quant.__file__).parent


def _jit_helpers(tree: ast.Module) -> set[str]:
    """Names of functions decorated with ``triton.jit`` anywhere in a module (also under ifs)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "jit":
                    names.add(node.name)
    return names


def _kernel_modules() -> dict[str, ast.Module]:
    """Dotted module name -> syntax tree, for every module of models.quant defining a jit function."""
    trees = {".".join(("models.quant", *path.relative_to(QUANT).with_suffix("").parts)): ast.parse(path.read_text())
             for path in QUANT.rglob("*.py")}
    return {name: tree for name, tree in trees.items() if _jit_helpers(tree)}


def test_the_kernel_modules_are_found():
    assert {f"models.quant.kernels.{name}" for name in ("nvfp4", "nvfp4_amax", "fp4_common", "fp8", "epilogue",
                                                         "triton_common")} <= set(_kernel_modules())


def test_jit_helpers_are_imported_under_their_own_names():
    modules = _kernel_modules()
    helpers = {name: _jit_helpers(tree) for name, tree in modules.items()}
    aliased = []
    for module_name, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("models.quant."):
                for alias in node.names:
                    if alias.name in helpers.get(node.module, ()) and alias.asname not in (None, alias.name):
                        aliased.append(f"{module_name}: {alias.name} as {alias.asname}")
    assert not aliased, f"jit helpers imported under another name (breaks Inductor): {aliased}"
