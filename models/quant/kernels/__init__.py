"""Triton fast paths of models.quant: one module per kernel family, each beside its torch reference.

    triton_common   the one Triton import site, the switch (``use_triton``), helpers every family uses
    options         the launch configurations: one frozen options object per family
    fp4_common      jit helpers of the E2M1 families: E2M1 rounding, stochastic rounding's bits, the RHT
    nvfp4           NVFP4 quantize kernels (rows 1x16, 2D 16x16, columns 16x1 with or without the RHT)
    nvfp4_tiles     their tile bodies: the values, or (codes only) the codes packed in the GEMM's layout
    nvfp4_amax      NVFP4's per-tensor amax passes (its global scales)
    mx              MXFP4 quantize kernels (rows 1x32, columns 32x1 with or without the RHT)
    fp8             blockwise / per-tensor FP8 for the native FP8 layer (models.quant.fp8_torch)
    epilogue        the emulated GEMM's output scaling

Each kernel function ``f`` has its torch reference ``f_ref`` (or ``quantize_ref``) defined or imported
by name in its module; the tests compare the two bit for bit on fresh inputs, compiled on the GPU
(``pytest -m gpu``) and under Triton's interpreter on the CPU (tests/models/quant/kernels_interpreted.py).

A family that quantizes the operands of the emulated linear (``models.quant.linear``) offers
``operand_supported``, ``shared_scales`` and ``quantize_operand``; a format's ``FormatSpec.quantize_kernel``
names that module, and the layer finds it as an attribute of this package.

Importing this package imports Triton (where installed); ``models.quant.linear`` imports it only
for CUDA tensors. Without Triton everything imports and ``has_triton()`` is False.
"""

from models.quant.kernels import epilogue, fp8, mx, nvfp4, nvfp4_amax, options  # noqa: F401 - the families
from models.quant.kernels.triton_common import INSTALL_HINT, enabled, has_triton, use_triton  # noqa: F401
