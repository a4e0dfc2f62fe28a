"""The Triton kernels' arithmetic checked on the CPU, under Triton's interpreter (kernels_interpreted.py).

It runs in a subprocess because TRITON_INTERPRET must be set before the kernels are defined, and this
process has defined them compiled. Skipped where Triton is not installed (.ci/run installs it; it is
not in the dev extra, whose users may have a torch pinned to an older Triton).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")


def _version(module) -> tuple:
    return tuple(int(part) for part in module.__version__.split(".")[:2] if part.isdigit())


def _interpreter_handles_this_numpy() -> bool:
    """Triton's interpreter before 3.7 fails under numpy >= 2.4 (int() of a one-element array in a
    loop bound, triton-lang/triton#9171)."""
    import numpy

    return _version(triton) >= (3, 7) or _version(numpy) < (2, 4)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.mark.skipif(not _interpreter_handles_this_numpy(),
                    reason="Triton < 3.7's interpreter fails under numpy >= 2.4 (triton-lang/triton#9171)")
@pytest.mark.parametrize("script, least", [("kernels_interpreted.py", 6), ("kernels_interpreted_four_over_six.py", 6),
                                           ("kernels_interpreted_ue5m3.py", 6), ("kernels_interpreted_nvfp4_torch.py", 6)])
def test_kernels_match_the_torch_references_under_the_interpreter(script, least):
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(HERE / script)], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    passed = [line for line in lines if line.startswith("ok check_")]
    assert lines and lines[-1] == f"all {len(passed)} checks passed" and len(passed) >= least, result.stdout
