"""Low-precision training numerics: formats, the random Hadamard transform, the quantized linear layer.

Kept light on purpose: importing ``models.quant`` imports nothing heavy (no Triton). Import the
submodules you need:

    from models.quant.format_registry import FORMAT_SPECS, format_spec   # every format's facts, one entry each
    from models.quant.formats import quantize, fake_quantize             # the torch reference of every format
    from models.quant.rht import rht, inverse_rht
    from models.quant.gemm_spec import OperandSpec, GemmSpec, LinearSpec, nvfp4_linear_spec
    from models.quant.quantized_linear import QuantizedLinear   # the base of every backend's layer
    from models.quant.linear import QuantLinear                 # the emulated backend
    from models.quant import kernels          # optional Triton fast paths (has_triton(), use_triton())
"""
