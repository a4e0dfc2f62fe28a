"""Load a script of scripts/ as a module in tests (scripts/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """Import scripts/<name>.py as a module, once per test process."""
    module_name = f"_script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, REPOSITORY / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
