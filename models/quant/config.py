"""Precision configuration: which format each linear layer's GEMMs use.

One dataclass drives the conversion pass of ``models.quant.recipe``. The named
recipes live in ``configs/precision/*.yaml``; every field can be overridden from
the command line (``precision.wgrad_rht=false``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

# The formats and backends a recipe may name: models.quant.format_registry (RECIPE_FORMATS, BACKENDS).


@dataclass
class PrecisionConfig:
    """Per-GEMM precision recipe for the model's linear layers."""

    name: str = "bf16"
    """Label of this recipe (bf16, fp8, nvfp4, mxfp4, mxfp8)."""
    format: str = "bf16"
    """Low-precision format of quantized GEMM operands: bf16 (none), nvfp4, nvfp4_4over6, nvfp4_ue5m3, mxfp4,
    mxfp8, fp8_block, fp8_tensor (models.quant.format_registry)."""
    backend: str = "auto"
    """Who runs the quantized GEMMs: auto, te (Transformer Engine), torch (torch's scaled matmul: FP8 on Hopper,
    NVFP4 on Blackwell), emulated."""
    bf16_layers_at_start: int = 0
    """Number of leading pattern symbols (blocks) whose linears stay in BF16."""
    bf16_layers_at_end: int = 0
    """Number of trailing pattern symbols (blocks) whose linears stay in BF16."""
    bf16_layer_globs: List[str] = field(default_factory=list)
    """fnmatch globs of linear names kept in BF16 as well, e.g. 'layers.*.mixer.o_proj'."""
    quantize_lm_head: bool = False
    """Quantize the output projection (lm_head) in the recipe's format too. Off as in the paper, which
    keeps it BF16; on for measuring what that costs (scripts/benchmark.py's lm_head-in-FP8 row)."""
    keep_indivisible_in_bf16: bool = False
    """Keep a linear whose dims do not divide the format's block size in BF16 (logged in the plan) instead of failing."""
    quantize_fprop: bool = True
    """Quantize the forward GEMM Y = X W^T."""
    quantize_dgrad: bool = True
    """Quantize the input-gradient GEMM dX = dY W."""
    quantize_wgrad: bool = True
    """Quantize the weight-gradient GEMM dW = dY^T X."""
    weight_2d: bool = True
    """NVFP4: one scale per 16x16 weight tile so Fprop and Dgrad see the same quantized W."""
    wgrad_rht: bool = True
    """NVFP4: random Hadamard transform (16x16) on both Wgrad operands along the token dim."""
    gradient_stochastic_rounding: bool = True
    """NVFP4: stochastic rounding of dY (Dgrad and Wgrad); RNE everywhere else."""
    four_over_six: List[str] = field(default_factory=list)
    """NVFP4 Four Over Six (arXiv 2512.02010): the operand roles, of 'x' (Fprop X, Wgrad X^T), 'w' (W) and
    'dy' (Dgrad dY, Wgrad dY^T), whose blocks each keep the lower-error of mapping their max to 4 or to 6.
    Empty: off for nvfp4, all three for nvfp4_4over6; other formats take none."""
    four_over_six_error: str = "mse"
    """The error Four Over Six compares: 'mse' (sum of squared differences, the paper's default) or 'mae'."""
    fp8_power_of_two_scales: bool = True
    """fp8_block: constrain block scales to powers of two, as TE's Float8BlockScaling does."""
    switch_to_bf16_at_step: Optional[int] = None
    """Late switch (paper App. D): from this optimizer step on, quantized layers run in BF16."""
    switch_to_bf16_at_tokens: Optional[int] = None
    """Late switch by tokens seen instead of steps (whichever is reached first)."""
    switch_mode: str = "forward"
    """What the late switch moves to BF16: 'forward' (Fprop only) or 'forward_backward' (all GEMMs)."""
    seed: int = 1234
    """Seed of the stochastic-rounding generator (combined with rank and step)."""
