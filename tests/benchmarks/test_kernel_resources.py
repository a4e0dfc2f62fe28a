"""The NVFP4 and MXFP4 quantization kernels compile for the H200 (sm_90a) without spilling registers, checked
on the CPU (benchmarks/kernel_resources.py: Triton compiles, its bundled ptxas assembles).

A change that made the kernels faster once made the 2D one spill under Triton 3.6 (255 registers,
6-7x slower on the GPU) while Triton 3.7 compiled it fine.
So the check runs with the installed Triton and, where CI provides it (TRITON_GPU_MACHINE_PATH, a
directory holding the GPU machine's Triton), with that one in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def _check(rows) -> None:
    from benchmarks.kernel_resources import VARIANTS

    by_name = {(row.name, row.input_dtype): row for row in rows}
    assert len(by_name) == 2 * len(VARIANTS) == 56, sorted(by_name)
    for row in rows:
        assert row.spill_bytes == 0 and row.local_memory_instructions == 0, row
        # Four Over Six's columns kernel holds both candidates' scales, reciprocals and units beside
        # its 32 elements a thread: Triton 3.6 gives it 137 registers with fp32 input (3.7: 109).
        assert row.registers <= (160 if row.name.startswith("4/6 columns") else 128), row
    for dtype in ("bf16", "fp32"):
        # The 2D kernel does the rows kernel's work plus one reduction per 16x16 tile: a layout
        # that replicates the tile in every thread shows as several times the rows kernel's SASS.
        rows_sass = by_name[("rows 1x16 RNE", dtype)].sass_instructions
        assert by_name[("2D 16x16 RNE", dtype)].sass_instructions < 1.5 * rows_sass, by_name
        # The same for Four Over Six, whose 2D kernel adds the tile's errors as a tree over its rows.
        rows_sass = by_name[("4/6 rows 1x16 RNE", dtype)].sass_instructions
        assert by_name[("4/6 2D 16x16 RNE", dtype)].sass_instructions < 1.5 * rows_sass, by_name
        # Its one reduction across the program (whether every block's errors may come from the
        # dequantization units) takes two barriers; a layout change through shared memory would add more.
        assert by_name[("4/6 columns RHT RNE", dtype)].barriers <= 2, by_name
        # UE5M3 block scales change one rounding per block: the kernels stay the E4M3 kernels' size.
        for ue5m3, e4m3 in [("UE5M3 rows 1x16 SR", "rows 1x16 SR"), ("UE5M3 2D 16x16 RNE", "2D 16x16 RNE"),
                            ("UE5M3 columns RHT SR", "columns 16x1 RHT SR")]:
            assert by_name[(ue5m3, dtype)].sass_instructions < 1.05 * by_name[(e4m3, dtype)].sass_instructions, by_name
        # Stochastic rounding along the columns moves its random words through shared memory at its
        # 2 x 128 x 4 launch (Nvfp4Options.columns_stochastic: faster on the H200 all the same);
        # RNE moves nothing there: a barrier in it would mean a layout change to look at.
        assert by_name[("columns 16x1 RNE", dtype)].barriers == 0, by_name
        assert by_name[("columns 16x1 RHT RNE", dtype)].barriers == 0, by_name
        for name in ("mx columns 32x1 RNE", "mx columns 32x1 RHT RNE", "mx columns 32x1 RHT SR"):
            assert by_name[(name, dtype)].barriers == 0, by_name


def test_kernels_compile_without_spills_with_the_installed_triton():
    from benchmarks.kernel_resources import kernel_resources

    try:
        rows = kernel_resources()
    except FileNotFoundError as missing:  # a Triton build without the NVIDIA tools
        pytest.skip(str(missing))
    _check(rows)


@pytest.mark.skipif(not os.environ.get("TRITON_GPU_MACHINE_PATH"),
                    reason="TRITON_GPU_MACHINE_PATH (the GPU machine's Triton, which .ci/run installs) is not set")
def test_kernels_compile_without_spills_with_the_gpu_machines_triton():
    path = os.environ["TRITON_GPU_MACHINE_PATH"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(ROOT)])}
    result = subprocess.run([sys.executable, "scripts/kernel_resources.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "Triton 3.6" in result.stdout, result.stdout  # the GPU machine's version, not the installed one
    from benchmarks.kernel_resources import KernelResources

    # Each line: kernel name (several words), input, registers, spill B, local ops, SASS, barriers.
    rows = []
    for line in result.stdout.splitlines()[2:]:
        fields = line.split()
        rows.append(KernelResources(" ".join(fields[:-6]), fields[-6], *map(int, fields[-5:])))
    _check(rows)
