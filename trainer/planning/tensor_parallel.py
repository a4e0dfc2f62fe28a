"""What one tensor-parallel rank computes: the step's GEMMs at their TP-local shapes.

Tensor parallelism over T ranks with sequence parallelism (Megatron's; trainer.planning.parameters has the
split of every parameter). Per block and micro-batch of t tokens, the mixer input [t, h] is all-gathered
along the sequence, the column-parallel linears (q/k/v, up_proj, Mamba in_proj) produce 1/T of their
output features for all t tokens, the mixer's own work (attention heads, conv and SSD heads, gated norm)
runs on 1/T of its width, and the row-parallel linears (o_proj, down_proj, out_proj) reduce 1/T of their
input features, their partial outputs reduce-scattered back to t/T tokens. Norms, residual adds and the
final norm run on t/T tokens; the LM head is column-parallel over the vocabulary (its input all-gathered,
V/T logits of all t tokens) and the loss reduces over the ranks' columns. So, per rank:

    column-parallel   Fprop  M = t    N = out/T  K = in      Dgrad  M = t  N = in  K = out/T
                      Wgrad  M = out/T  N = in   K = t
    row-parallel      Fprop  M = t    N = out    K = in/T    Dgrad  M = t  N = in/T  K = out
                      Wgrad  M = out  N = in/T   K = t
    attention BMMs    batch / T (the local heads)
    LM head           as a column-parallel linear (out = V)

Every GEMM's FLOPs are 1/T of the unsplit one's; the operands a rank reads are not all 1/T (the gathered
input X [t, h] is whole on every rank), which the GEMM and quantization traffic see through the shapes.
Not modelled: a GEMM's efficiency falling as its shape shrinks (the same share of the peak is assumed).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

from models.config import ModelConfig
from models.gemms import ATTENTION_KIND, Gemm, block_linears, training_gemms
from models.quant.format_registry import FORMAT_SPECS
from trainer.planning.gemm_costs import REPORT_NAMES
from trainer.planning.parameters import COLUMN_PARALLEL, ROW_PARALLEL

_REGISTRY_NAMES = {report: registry for registry, report in REPORT_NAMES.items()}


def local_gemm(gemm: Gemm, tp: int) -> Gemm:
    """``gemm`` as one of ``tp`` ranks runs it (the module docstring's table)."""
    if tp == 1:
        return gemm
    if gemm.kind == ATTENTION_KIND:
        return dataclasses.replace(gemm, batch=gemm.batch // tp)
    module = gemm.name.rsplit(".", 1)[-1]
    M, N, K = gemm.M, gemm.N, gemm.K
    if module in COLUMN_PARALLEL or module == "lm_head":  # out / T (the LM head: V / T)
        shape = {"fprop": (M, N // tp, K), "dgrad": (M, N, K // tp), "wgrad": (M // tp, N, K)}[gemm.kind]
    elif module in ROW_PARALLEL:  # in / T
        shape = {"fprop": (M, N, K // tp), "dgrad": (M, N // tp, K), "wgrad": (M, N // tp, K)}[gemm.kind]
    else:
        raise ValueError(f"no tensor-parallel split for GEMM {gemm.name!r}")
    return dataclasses.replace(gemm, M=shape[0], N=shape[1], K=shape[2])


_CACHE: Dict[tuple, Tuple[Gemm, ...]] = {}


def local_training_gemms(cfg: ModelConfig, tokens: int, seq_len: int, tp: int) -> Tuple[Gemm, ...]:
    """models.gemms.training_gemms of one micro-batch of ``tokens`` tokens, as one TP rank runs them (cached)."""
    key = (repr(cfg), tokens, seq_len, tp)
    if key not in _CACHE:
        _CACHE[key] = tuple(local_gemm(gemm, tp) for gemm in training_gemms(cfg, tokens, seq_len))
    return _CACHE[key]


def quantized_split_problem(cfg: ModelConfig, gemm_formats: Dict[str, Dict[str, str]], tp: int) -> str:
    """Why the TP pass would refuse ``tp`` for these quantized linears ('' when it would not): each rank's share
    of a quantized linear's split dimension must hold whole quantization blocks (the largest block edge among
    its quantized operands; trainer.tensor_parallel._check_whole_blocks)."""
    if tp == 1:
        return ""
    linears = [(f"layers.{index}.mixer.{module}", module in COLUMN_PARALLEL, in_features, out_features)
               for index, symbol in enumerate(cfg.pattern)
               for module, _, in_features, out_features in block_linears(cfg, symbol)]
    linears.append(("lm_head", True, cfg.hidden_size, cfg.vocab_size))  # column-parallel over the vocabulary
    for name, column, in_features, out_features in linears:
        formats = {fmt for fmt in gemm_formats.get(name, {}).values() if fmt != "bf16"}
        if not formats:
            continue
        edge = max(FORMAT_SPECS[_REGISTRY_NAMES.get(fmt, fmt)].block_edge for fmt in formats)
        dim, size = ("out_features", out_features) if column else ("in_features", in_features)
        if size % (tp * edge):
            return (f"layer {name!r} splits {dim} {size} into {tp} shards of {size / tp:g}, not a multiple of "
                    f"its quantization block ({edge})")
    return ""
