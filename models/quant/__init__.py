"""Low-precision training numerics: formats, the random Hadamard transform, the quantized linear layer.

Kept light on purpose: importing ``models.quant`` imports nothing heavy (no Triton). Import the
submodules you need:

    from models.quant.formats import quantize, fake_quantize
    from models.quant.rht import rht, inverse_rht
    from models.quant.linear import QuantLinear, OperandSpec, GemmSpec, LinearSpec
    from models.quant import kernels          # optional Triton fast paths (has_triton(), use_triton())
"""
