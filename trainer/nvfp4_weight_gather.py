"""FSDP2 gathers NVFP4 weights as their codes: 4.5 bits an element on the wire instead of BF16's 16.

A quantized linear whose Fprop W is NVFP4 with 16x16 blocks (the paper's 2D weight scaling) quantizes its
weight the same way for Fprop and, transposed, for Dgrad (a 16x16 tile of W is a tile of W^T), and from the
BF16 copy FSDP2 gathers. So each rank can quantize its own rows of that copy and the ranks gather the codes:

    rank's rows    W_r [n, K] = bf16(master shard)           n = N / S rows, a multiple of 16
    quantized      codes_r [n, K/2] uint8 (two E2M1 a byte), scales_r [n/16, K/16] E4M3 bits,
                   with the whole weight's amax (S_enc = 448 * 6 / amax), not the shard's
    gathered       codes [N, K/2], scales [N/16, K/16]: the very codes and scales of quantize(W)

Blocks never straddle two ranks' rows (n is a multiple of 16) and every rank scales with the same
per-tensor amax, so the gathered codes are those of the whole BF16 weight, bit for bit; the layer takes
them for Fprop's W and Dgrad's W^T (``GatheredNVFP4Weight.operand``) instead of quantizing W itself.

The amax: one all-reduce (max) of every such weight's local amax, over all ranks (a rank's rows and
tensor-parallel shard are both parts of the weight, and replicas hold the same values), before every forward
of the model (``refresh_weight_amaxes``, a forward pre-hook ahead of FSDP2's: the weights changed at most at
the last optimizer step), as torchao precomputes its FP8 scales for FSDP.

The mechanism is FSDP2's extension point on the sharded parameter's local tensor (``fsdp_pre_all_gather``,
``fsdp_post_all_gather``): ``NVFP4ShardedWeight`` wraps the FP32 master shard (every op on it is an op on
the shard: optimizer, checkpoint, clipping see a plain tensor's values) and gathers codes;
``GatheredNVFP4Weight`` is the unsharded parameter the layer receives, shape [N, K] in the compute dtype, its
gradient a plain tensor FSDP2 reduce-scatters. The layers take it in models.quant.linear (the emulated
GEMMs) and models.quant.nvfp4_torch (Blackwell's), by duck type (``quantized``).
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._pytree import tree_map_only

from models.quant.formats import quantize
from models.quant.formats.quantized_tensor import QuantizedTensor
from models.quant.quantized_linear import abs_max, all_reduce_amax, with_amax_rows

TILE = (16, 16)
_E4M3 = torch.float8_e4m3fn
_WARNED: set = set()

# Ops whose result is still the same weight's shard (FSDP2's own chunking, padding, views and copies): kept
# wrapped so the extension follows the shard; every other op sees the plain FP32 shard.
_KEEP_WRAPPED = {
    torch.ops.aten.empty_like.default, torch.ops.aten.new_zeros.default, torch.ops.aten.slice.Tensor,
    torch.ops.aten.copy_.default, torch.ops.aten.view.default, torch.ops.aten.as_strided.default,
    torch.ops.aten._to_copy.default, torch.ops.aten._pin_memory.default, torch.ops.aten.split.Tensor,
    torch.ops.aten.clone.default, torch.ops.aten.detach.default, torch.ops.aten.alias.default,
}


class WeightAmax:
    """The whole weight's amax (fp32, 0-dim), shared by a weight's shard and every tensor derived from it."""

    def __init__(self, device):
        self.value = torch.zeros((), dtype=torch.float32, device=device)
        self.fresh = False


class NVFP4ShardedWeight(torch.Tensor):
    """The FP32 master weight (or a rank's shard of it) whose FSDP2 all-gather moves NVFP4 codes."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, amax: WeightAmax):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            layout=data.layout, device=data.device, requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor, amax: WeightAmax):
        self._data = data
        self._amax = amax

    def __repr__(self) -> str:
        return f"NVFP4ShardedWeight({self._data!r})"

    def __tensor_flatten__(self):
        return ["_data"], self._amax

    @staticmethod
    def __tensor_unflatten__(inner, amax, outer_size, outer_stride):
        return NVFP4ShardedWeight(inner["_data"], amax)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        amax = None

        def unwrap(tensor):
            nonlocal amax
            amax = tensor._amax
            return tensor._data

        out = func(*tree_map_only(NVFP4ShardedWeight, unwrap, args), **tree_map_only(NVFP4ShardedWeight, unwrap, kwargs))
        if func not in _KEEP_WRAPPED:
            return out
        return tree_map_only(torch.Tensor, lambda t: NVFP4ShardedWeight(t, amax), out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        compute = self._data.to(mp_policy.param_dtype or self._data.dtype)
        if not self._amax.fresh:
            raise RuntimeError("an NVFP4 weight is gathered before its amax was taken: install_amax_refresh "
                               "registers the forward pre-hook that takes it")
        rows = compute.shape[0]
        # The whole weight's amax on an appended tile (the torch reference takes a tensor's amax from its values).
        quantized = quantize(with_amax_rows(compute, self._amax.value.reshape(1), TILE[0]), "nvfp4", tile=TILE)
        codes = quantized.packed_codes()[:rows]
        scales = quantized.block_scales[:rows // TILE[0]].view(torch.uint8)
        return (codes, scales), (quantized.tensor_scale, quantized.amax, compute.dtype)

    def fsdp_post_all_gather(self, outputs: Tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, *,
                             out: Optional[torch.Tensor] = None):
        codes, scales = outputs
        tensor_scale, amax, dtype = metadata
        if out is not None:  # FSDP2 gathered into the same buffers (the codes are in place): only the scale is new
            local = getattr(out, "_local_tensor", out)  # the object the layer reads (to_local() may alias it)
            local._tensor_scale, local._amax = tensor_scale, amax
            return None
        return GatheredNVFP4Weight(codes, scales, tensor_scale, amax, dtype), (codes, scales)


def _unpacked(packed: torch.Tensor) -> torch.Tensor:
    """[rows, cols / 2] two codes a byte (even column low) -> [rows, cols] one code a byte."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


class GatheredNVFP4Weight(torch.Tensor):
    """A whole weight [N, K] as FSDP2 gathered it: its NVFP4 codes and scales, in the compute dtype's clothes.

    The layers ask for ``quantized`` (the emulated GEMMs' values) or ``nvfp4_codes`` (the native GEMM's operand);
    any other op sees the dequantized weight (q s_b / S_enc in the compute dtype) and says so once."""

    @staticmethod
    def __new__(cls, codes, scales, tensor_scale, amax, dtype):
        shape = torch.Size([codes.shape[0], codes.shape[1] * 2])
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=codes.device)

    def __init__(self, codes, scales, tensor_scale, amax, dtype):
        self._codes, self._scales, self._tensor_scale, self._amax = codes, scales, tensor_scale, amax

    def __repr__(self) -> str:
        return f"GatheredNVFP4Weight(shape={tuple(self.shape)}, dtype={self.dtype})"

    def nvfp4_codes(self):
        """The codes as the native NVFP4 GEMM takes them (models.quant.nvfp4_layout.Nvfp4Codes)."""
        from models.quant.nvfp4_layout import Nvfp4Codes

        return Nvfp4Codes(self._codes, self._scales, self._tensor_scale, TILE[0])

    def quantized(self) -> QuantizedTensor:
        return QuantizedTensor("nvfp4", _unpacked(self._codes), self._scales.view(_E4M3), self._tensor_scale, TILE,
                               self.shape, self.dtype, amax=self._amax)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        weight = args[0] if args else None
        # FSDP2 makes the unsharded parameter from the gathered tensor by as_strided to its own shape and
        # nn.Parameter's detach, and a tensor-parallel DTensor's to_local() views its local tensor whole: aliases
        # of the same codes.
        same_shape = isinstance(weight, GatheredNVFP4Weight) and len(args) > 1 and isinstance(args[1], (list, tuple)) \
            and tuple(args[1]) == tuple(weight.shape)
        aliasing = func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default) or (
            func is torch.ops.aten.as_strided.default and same_shape and (len(args) < 4 or args[3] in (None, 0))) or (
            func is torch.ops.aten.view.default and same_shape)
        if aliasing and isinstance(weight, GatheredNVFP4Weight):
            return GatheredNVFP4Weight(weight._codes, weight._scales, weight._tensor_scale, weight._amax,
                                       weight.dtype)

        if func not in _WARNED:  # correct, but not what the layers do: say so once per op
            _WARNED.add(func)
            warnings.warn(f"{func} took a gathered NVFP4 weight dequantized (the quantized layers take its codes)")

        def dequantized(weight):
            return weight.quantized().dequantize(weight.dtype)

        return func(*tree_map_only(GatheredNVFP4Weight, dequantized, args),
                    **tree_map_only(GatheredNVFP4Weight, dequantized, kwargs))


def nvfp4_gatherable(linear: nn.Module, shard: int) -> bool:
    """Whether ``linear``'s weight can travel as codes: a quantized linear (emulated or Blackwell's torch layer)
    whose Fprop W is NVFP4 in 16x16 tiles (round to nearest, no Four Over Six, no RHT), reused by Dgrad, with
    rows that split over ``shard`` ranks in whole 16-row tiles."""
    spec = getattr(linear, "spec", None)
    fprop = getattr(spec, "fprop", None)
    if fprop is None or spec.dgrad is None or getattr(spec, "backend", None) not in ("emulated", "torch"):
        return False
    w = fprop.b
    rows, cols = local_shape(linear.weight)
    return (w.fmt == "nvfp4" and tuple(w.tile) == TILE and w.rounding == "nearest" and not w.rht
            and w.four_over_six is None and spec.reuses_forward_weight
            and rows % (TILE[0] * shard) == 0 and cols % TILE[1] == 0)


def _local_of(weight: torch.Tensor) -> torch.Tensor:
    """This rank's tensor of a (DTensor) weight: a wrapped weight's NVFP4ShardedWeight."""
    return weight.to_local() if hasattr(weight, "to_local") else weight


def local_shape(weight: torch.Tensor) -> torch.Size:
    """A weight's shape on this rank before FSDP (its tensor-parallel shard's)."""
    return _local_of(weight).shape


def wrap_nvfp4_weights(model: nn.Module, shard: int) -> List[nn.Module]:
    """Before fully_shard (after tensor parallelism): give every gatherable linear's weight the NVFP4 gather;
    returns those linears."""
    from torch.distributed.tensor import DTensor

    if shard < 2:  # FSDP2 copies a one-rank shard group's parameters whole: nothing is gathered
        return []
    head = getattr(model, "lm_head", None)  # FSDP2 keeps the head gathered; BF16 in the paper's recipe anyway
    wrapped = []
    for module in model.modules():
        if module is head or not nvfp4_gatherable(module, shard):
            continue
        weight = module.weight
        if isinstance(weight, DTensor):  # a tensor-parallel shard: its local tensor gathers codes
            local = _local_of(weight)
            data = DTensor.from_local(NVFP4ShardedWeight(local.detach(), WeightAmax(local.device)),
                                      weight.device_mesh, weight.placements, run_check=False,
                                      shape=weight.shape, stride=weight.stride())
        else:
            data = NVFP4ShardedWeight(weight.data, WeightAmax(weight.device))
        module.weight = nn.Parameter(data, requires_grad=weight.requires_grad)
        module.register_state_dict_post_hook(_plain_weight_in_state_dict)
        # A compiled block would take the gathered weight apart into its codes (its tensors, not it, become the
        # graph's inputs) and the weight would get no gradient: the quantized GEMMs run outside the graph.
        module.quantized_matmul = torch.compiler.disable(module.quantized_matmul)
        wrapped.append(module)
    return wrapped


def _plain_weight_in_state_dict(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """A checkpoint holds the plain FP32 weight (a view of the shard's values: DCP loads into it in place), so
    it loads with or without parallel.gather_nvfp4_weights and needs none of this module to unpickle."""
    key = prefix + "weight"
    tensor = state_dict.get(key)
    if tensor is None:
        return
    if hasattr(tensor, "to_local"):
        from torch.distributed.tensor import DTensor

        local = _local_of(tensor)
        if isinstance(local, NVFP4ShardedWeight):
            state_dict[key] = DTensor.from_local(local._data, tensor.device_mesh, tensor.placements, run_check=False,
                                                 shape=tensor.shape, stride=tensor.stride())
    elif isinstance(tensor, NVFP4ShardedWeight):
        state_dict[key] = tensor._data


@torch.no_grad()
def refresh_weight_amaxes(linears: List[nn.Module], compute_dtype: torch.dtype) -> None:
    """Every wrapped weight's amax (of its compute-dtype copy, as the layer would take it), in one all-reduce
    (max) over all ranks."""
    if not linears:
        return
    shards = [_local_of(module.weight) for module in linears]
    # The layers' own amax reduction (NaN counted as Inf), over the world: one call for every weight.
    reduced = all_reduce_amax(torch.cat([abs_max(shard._data.to(compute_dtype)) for shard in shards]),
                              dist.group.WORLD)
    for shard, value in zip(shards, reduced):
        shard._amax.value.copy_(value)
        shard._amax.fresh = True


def install_amax_refresh(model: nn.Module, linears: List[nn.Module], compute_dtype: torch.dtype):
    """Take the wrapped weights' amaxes before every forward of ``model``, ahead of FSDP2's gathers (a forward
    pre-hook run before FSDP2's own). Returns the hook's handle."""
    def refresh(module, args, kwargs):
        refresh_weight_amaxes(linears, compute_dtype)

    return model.register_forward_pre_hook(refresh, prepend=True, with_kwargs=True)
