"""Every parameter of the model with its shape, how tensor parallelism splits it and its FSDP unit.

From the dimensions alone (no build; tests/trainer/test_planning_collectives.py checks the table against
the model built on the meta device). Shapes as torch stores them (nn.Linear: [out, in]).

Tensor parallelism over T ranks (Megatron's split, as the trainer's TP pass applies it; ``tp_dim`` is the
dimension split in T, None for a parameter replicated on every TP rank):

    block norm.weight [h]                         replicated (the norms run on tokens / T: sequence parallel)
    Mamba-2   in_proj [2d + 2GN + H, h]           dim 0, by groups and heads (column-parallel)
              conv1d.weight [d + 2GN, 1, K], bias dim 0 (the local channels)
              dt_bias, A_log, D [H]               dim 0 (the local heads)
              norm.weight [d] (gated norm)        dim 0 (its groups are local)
              out_proj [h, d]                     dim 1 (row-parallel)
    attention q/k/v_proj [Hq a | Hkv a, h]        dim 0 (by heads; column-parallel)
              o_proj [h, Hq a]                    dim 1 (row-parallel)
    MLP       up_proj [F, h]                      dim 0 (column-parallel)
              down_proj [h, F]                    dim 1 (row-parallel)
    outside   embeddings.weight [V, h], lm_head.weight [V, h]   dim 0 (vocabulary-parallel)
              norm_f.weight [h]                               replicated

FSDP2 units (trainer.distributed.apply_fsdp), in the order they run forward: the embedding
(``embeddings``), one per block (``layers.i``), the head (``head``: norm_f and lm_head); the root module
holds no parameter of its own and issues no collective. FSDP2 shards each parameter's TP-local tensor along dim 0 over the shard
group of S ranks, padding dim 0 to a multiple of S; a unit's all-gather and reduce-scatter move one flat
buffer of its parameters' padded local sizes (torch.distributed.fsdp._fully_shard: _fsdp_collectives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from models.config import ModelConfig
from models.gemms import block_linears

EMBEDDINGS, HEAD = "embeddings", "head"

# Block linears split column-wise (output features, dim 0) or row-wise (input features, dim 1).
COLUMN_PARALLEL = frozenset({"in_proj", "q_proj", "k_proj", "v_proj", "up_proj"})
ROW_PARALLEL = frozenset({"out_proj", "o_proj", "down_proj"})


@dataclass(frozen=True)
class Param:
    name: str
    shape: Tuple[int, ...]
    tp_dim: Optional[int]
    """The dimension tensor parallelism splits (None: replicated over the TP group)."""

    def local_shape(self, tp: int) -> Tuple[int, ...]:
        if self.tp_dim is None or tp == 1:
            return self.shape
        return tuple(size // tp if dim == self.tp_dim else size for dim, size in enumerate(self.shape))

    def local_numel(self, tp: int) -> int:
        return math.prod(self.local_shape(tp))

    def padded_numel(self, tp: int, shard: int) -> int:
        """Elements of FSDP2's unsharded buffer for this parameter: TP-local dim 0 padded to a multiple of S."""
        local = self.local_shape(tp)
        return math.ceil(local[0] / shard) * shard * math.prod(local[1:])


@dataclass(frozen=True)
class Unit:
    """One FSDP2 unit: the embedding, a block (``layers.i``) or the head."""

    name: str
    symbol: Optional[str]
    """The block's pattern symbol; None for the embedding and the head."""
    params: Tuple[Param, ...]

    def numel(self) -> int:
        return sum(math.prod(p.shape) for p in self.params)

    def local_numel(self, tp: int) -> int:
        return sum(p.local_numel(tp) for p in self.params)

    def padded_numel(self, tp: int, shard: int) -> int:
        return sum(p.padded_numel(tp, shard) for p in self.params)

    def replicated(self) -> Tuple[Param, ...]:
        """Parameters every TP rank holds whole (their gradients are all-reduced over TP)."""
        return tuple(p for p in self.params if p.tp_dim is None)


def _linear_split(module: str) -> int:
    if module in COLUMN_PARALLEL:
        return 0
    if module in ROW_PARALLEL:
        return 1
    raise ValueError(f"no tensor-parallel split for linear {module!r}")


def block_params(cfg: ModelConfig, symbol: str, prefix: str) -> Tuple[Param, ...]:
    """The parameters of one block, in the module's order."""
    h = cfg.hidden_size
    params = [Param(f"{prefix}.norm.weight", (h,), None)]
    mixer = f"{prefix}.mixer"
    linears = {module: Param(f"{mixer}.{module}.weight", (out_features, in_features), _linear_split(module))
               for module, _, in_features, out_features in block_linears(cfg, symbol)}
    if symbol == "M":
        d, gn, heads = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size, cfg.mamba_num_heads
        params += [Param(f"{mixer}.{name}", (heads,), 0) for name in ("dt_bias", "A_log", "D")]
        params += [linears["in_proj"], Param(f"{mixer}.conv1d.weight", (d + 2 * gn, 1, cfg.conv_kernel), 0),
                   Param(f"{mixer}.conv1d.bias", (d + 2 * gn,), 0), Param(f"{mixer}.norm.weight", (d,), 0),
                   linears["out_proj"]]
    else:
        params += list(linears.values())
    return tuple(params)


def embedding_params(cfg: ModelConfig) -> Tuple[Param, ...]:
    return (Param("embeddings.weight", (cfg.vocab_size, cfg.hidden_size), 0),)


def head_params(cfg: ModelConfig) -> Tuple[Param, ...]:
    V, h = cfg.vocab_size, cfg.hidden_size
    return (Param("norm_f.weight", (h,), None), Param("lm_head.weight", (V, h), 0))


_UNITS: Dict[str, Tuple[Unit, ...]] = {}


def fsdp_units(cfg: ModelConfig) -> Tuple[Unit, ...]:
    """The FSDP2 units in the order they run forward: the embedding, the blocks in pattern order, the head."""
    key = repr(cfg)
    if key not in _UNITS:
        blocks = tuple(Unit(f"layers.{i}", s, block_params(cfg, s, f"layers.{i}")) for i, s in enumerate(cfg.pattern))
        _UNITS[key] = (Unit(EMBEDDINGS, None, embedding_params(cfg)),) + blocks + (Unit(HEAD, None, head_params(cfg)),)
    return _UNITS[key]


@dataclass(frozen=True)
class UnitSize:
    """A unit's sizes on one layout: TP-local elements and FSDP2's padded buffer elements."""

    name: str
    symbol: Optional[str]
    local_numel: int
    padded_numel: int
    replicated_padded: Tuple[Tuple[str, int], ...]
    """(parameter name, padded elements) of each parameter replicated over TP."""


_SIZES: Dict[tuple, Tuple[UnitSize, ...]] = {}


def unit_sizes(cfg: ModelConfig, tp: int, shard: int) -> Tuple[UnitSize, ...]:
    """Every unit's sizes at this TP degree and FSDP shard group (cached: parallel=auto asks often)."""
    key = (repr(cfg), tp, shard)
    if key not in _SIZES:
        _SIZES[key] = tuple(
            UnitSize(unit.name, unit.symbol, unit.local_numel(tp), unit.padded_numel(tp, shard),
                     tuple((p.name, p.padded_numel(tp, shard)) for p in unit.replicated()))
            for unit in fsdp_units(cfg))
    return _SIZES[key]


def local_parameters(cfg: ModelConfig, tp: int) -> int:
    """Parameters one TP rank holds before FSDP sharding: the split ones / T plus the replicated ones."""
    return sum(unit.local_numel for unit in unit_sizes(cfg, tp, 1))


def largest_block_local(cfg: ModelConfig, tp: int) -> int:
    """TP-local parameters of the largest block."""
    return max(unit.local_numel for unit in unit_sizes(cfg, tp, 1) if unit.symbol is not None)


def head_local(cfg: ModelConfig, tp: int) -> int:
    """TP-local parameters of the head unit (the final norm, replicated; the LM head's rows / tp)."""
    return next(unit.local_numel for unit in unit_sizes(cfg, tp, 1) if unit.name == HEAD)
