"""What every quantized linear layer shares; a backend supplies only its GEMMs.

``QuantizedLinear(nn.Linear)`` computes ``Y = X W^T (+ b)`` with its three GEMMs (Fprop
``Y = X W^T``, Dgrad ``dX = dY W``, Wgrad ``dW = dY^T X``) as its ``LinearSpec`` says
(``models.quant.gemm_spec``). It owns, for every backend:
- adopting an ``nn.Linear``'s very Parameter objects (``from_linear``: no copy, no re-initialization;
  the optimizer, FSDP and checkpoints see the same tensors and state-dict keys);
- the compute dtype: autocast's when autocast is on for the input's device, else the input's;
- the shape checks (a dim that does not divide its blocks is an error naming the layer, the GEMM,
  the operand and the dim; nothing is padded), the bias (added after the GEMM in the compute dtype);
- the spec and the late switch to BF16 (``set_high_precision``: those GEMMs run in the compute dtype);
- the per-step state of stochastic rounding: ``set_seed(seed, layer)`` once, then ``set_step(step,
  rank)`` every optimizer step and ``set_micro_step(i)`` every micro-batch write
  ``mix_seed(seed, layer, step, rank, i)`` into the device tensor ``sr_seed``. Every draw is a
  function of those five numbers, so a resumed run rounds exactly as an uninterrupted one, and
  data-parallel ranks and micro-batches draw independently. A tensor, not a torch.Generator: a
  Generator cannot enter a torch.compile graph (Dynamo broke the graph at every quantized linear;
  the H200's NVFP4 study step took 179.6 ms with per-layer generators against 111.4 ms without)
  nor a CUDA graph, while a tensor written between steps can. Each operand then offsets the seed
  by a constant of its own (``models.quant.linear``).
- tensor parallelism (``set_tensor_parallel``, called by trainer/tensor_parallel.py): the weight
  may be a DTensor whose local shard the GEMMs take (``local_tensor``); the per-tensor amax of the
  operands that are sharded over the group (``TP_AMAX_OPERANDS`` by role) is the group's maximum
  (``group_amax``, the one place it is reduced), so a sharded layer quantizes exactly as the
  unsharded one when each shard holds whole blocks (the pass checks that); and the stochastic-rounding
  seed mixes in the tensor-parallel rank.
A subclass implements ``quantized_matmul(x, compute_dtype)`` (an autograd function over x and the
weight): ``models.quant.linear.QuantLinear`` (emulated), ``models.quant.fp8_torch.TorchFp8Linear``
(native FP8 through torch's scaled matmul). Transformer Engine's layers are TE's own modules
(``models.quant.te_backend``).

torch.compile: nothing on the forward's passing path reads the layer's name (errors format it
only when they are raised), so layers that differ only in name share one compiled graph instead of
recompiling once per layer (torch._dynamo's recompile limit would otherwise send most layers eager).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.norms import local_tensor
from models.quant.format_registry import FORMAT_SPECS, GEMMS
from models.quant.gemm_spec import LinearSpec, check_linear_shapes


def high_precision_gemm(a: torch.Tensor, b: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """a [M, R] times b [N, R]^T in the compute dtype, as nn.Linear (under autocast) computes it."""
    with torch.autocast(a.device.type, enabled=False):  # the dtype is chosen here (see linear._gemm)
        return a.to(compute_dtype) @ b.to(compute_dtype).t()


def autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)`` where autocast is on, else a no-op context.

    ``QuantizedLinear.forward`` runs the backend's autograd function inside it: the quantizers and
    GEMMs choose their dtypes themselves, and autocast would recast some of their ops (on CUDA,
    ``linalg_vector_norm``, the amax, would first copy a bf16 operand to fp32). Only where needed,
    so that torch.compile traces no autocast context when there is none. The backward runs under
    the autocast of its caller (the trainer calls it outside autocast, but torch.compile traces it
    under the forward's), so the emulation's GEMMs switch autocast off themselves (``linear._gemm``).
    """
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


SEED_BITS = 62
"""``sr_seed`` holds values below 2^62, so a seed plus an operand's 32-bit offset stays an int64."""


def mix_seed(seed: int, layer: int, step: int, rank: int, micro_step: int = 0, tp_rank: int = 0) -> int:
    """A 63-bit seed from the run seed, layer index, step, rank, micro-batch and tensor-parallel rank
    (splitmix-style mixing; ``tp_rank`` 0 gives the seed of a run without tensor parallelism)."""
    value = (seed * 0x9E3779B97F4A7C15 + layer * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB + rank
             + micro_step * 0xD6E8FEB86659FD93 + tp_rank * 0x2545F4914F6CDD1D) % (1 << 64)
    value ^= value >> 31
    return value % (1 << 63)


# ----------------------------------------------------------------------------------------------
# Tensor parallelism: the per-tensor amax of sharded operands

TP_AMAX_OPERANDS = {
    # W [N/tp, K] and the output's columns (dY [T, N/tp], dY^T [N/tp, T]) are the rank's; X [T, K]
    # (sequence-gathered) and so X^T are the same on every rank.
    "column": frozenset({"Fprop W", "Dgrad W^T", "Dgrad dY", "Wgrad dY^T"}),
    # W [N, K/tp] and the input's columns (X [T, K/tp], X^T [K/tp, T]) are the rank's; dY [T, N]
    # (the output's gradient, sequence-gathered) and so dY^T are the same on every rank.
    "row": frozenset({"Fprop X", "Fprop W", "Dgrad W^T", "Wgrad X^T"}),
}
"""Tensor-parallel role of a layer -> the operands (``models.quant.linear.OPERAND_NAMES``) whose
per-tensor amax is reduced over the tensor-parallel group."""
GATHERED_INPUT_OPERANDS = frozenset({"Fprop X", "Wgrad X^T"})
"""The operands of a column-parallel layer that gathers its sequence-parallel input itself, quantized
(``models.quant.nvfp4_torch``): quantized from the rank's tokens, they take the group's amax too."""
SCATTERED_OUTPUT_OPERANDS = frozenset({"Dgrad dY", "Wgrad dY^T"})
"""The operands of a row-parallel layer that reduce-scatters its output itself and gathers the output's
gradient as codes (``models.quant.nvfp4_torch``): quantized from the rank's tokens, they take the group's amax."""


@dataclass(frozen=True)
class AmaxReduction:
    """Which operands of a layer take the group's amax, and over which process group."""

    group: object
    """The torch.distributed ProcessGroup (the tensor-parallel group)."""
    operands: frozenset

    def applies(self, name: str, fmt: str) -> bool:
        """Whether operand ``name`` ('Fprop W', ...) quantized to element format ``fmt`` takes the
        group's amax: it is sharded and the format has a per-tensor scale (NVFP4, FP8 per tensor;
        block formats without one quantize each shard exactly as the whole already)."""
        return name in self.operands and FORMAT_SPECS[fmt].amax_pass


def abs_max(tensor: torch.Tensor) -> torch.Tensor:
    """max |tensor| of this rank's values (fp32 [1]): the torch path's local amax."""
    return torch.linalg.vector_norm(tensor, float("inf"), dtype=torch.float32).reshape(1)


def group_amax(tensor: torch.Tensor, group) -> torch.Tensor:
    """max |tensor| over every rank of ``group`` (fp32 [1]), from this rank's values (the torch path)."""
    return all_reduce_amax(abs_max(tensor), group)


def all_reduce_amax(amax: torch.Tensor, group) -> torch.Tensor:
    """The max over every rank of ``group`` of each rank's fp32 [1] amax: where a sharded operand's per-tensor
    amax is reduced (MAX), the one place (the torch path's ``group_amax`` and the kernels' own amax passes). A
    NaN counts as +Inf (a max may drop NaN), so a non-finite value on any rank makes every rank's decode scale
    NaN, as the unsharded tensor's would be. Without a process group (one process) the value is its own max."""
    import torch.distributed._functional_collectives as funcol

    amax = torch.nan_to_num(amax.float(), nan=float("inf"), posinf=float("inf"))
    if not torch.distributed.is_initialized():
        return amax
    return funcol.wait_tensor(funcol.all_reduce(amax, "max", group))


def with_amax_rows(matrix: torch.Tensor, amax: torch.Tensor, rows: int) -> torch.Tensor:
    """``matrix`` [R, C] with ``rows`` rows appended (a whole tile's height) whose first value is ``amax``.

    The torch formats take a tensor's amax as the max of its blocks: the appended tile raises it to
    ``amax`` (the group's, >= every |value| here; exact in the matrix's dtype, being one of the group's
    values or +Inf) and leaves every other block's scale and values as they are. The caller drops
    the appended rows of the result (``[:R]``). A copy of the operand (the torch path only), in its memory
    order: a transposed (column-major) operand stays one, so the quantized values and the GEMM see the
    layout they see without tensor parallelism."""
    block = matrix.new_zeros(rows, matrix.shape[1])
    block[0, 0] = amax.to(matrix.dtype)[0]
    if not matrix.is_contiguous() and matrix.t().is_contiguous():
        return torch.cat([matrix.t(), block.t()], dim=1).t()
    return torch.cat([matrix, block])


class QuantizedLinear(nn.Linear):
    """nn.Linear whose GEMMs follow ``spec`` (same parameters and state-dict keys as nn.Linear).

    ``spec`` may be replaced at any time (late switch to BF16); a spec with no quantized GEMM runs
    exactly ``F.linear``. ``name`` (the module's fully qualified name) appears in every error.
    Stochastic rounding draws from ``generator`` when one is set (a torch.Generator: tests, studies
    of one layer), else from ``sr_seed`` once ``set_step`` has written it (training), else from
    torch's global RNG.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        spec: Optional[LinearSpec] = None,
        name: str = "",
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_state(spec if spec is not None else self.default_spec(), name)

    @classmethod
    def from_linear(cls, linear: nn.Linear, spec: LinearSpec, *, name: str = "") -> "QuantizedLinear":
        """Wrap an existing nn.Linear, keeping the very same Parameter objects (no copy)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features = linear.in_features
        module.out_features = linear.out_features
        module.register_parameter("weight", linear.weight)
        module.register_parameter("bias", linear.bias)
        module.train(linear.training)
        module._init_state(spec, name)
        return module

    def _init_state(self, spec: LinearSpec, name: str) -> None:
        self.name = name  # first: a backend's spec check names the layer
        self.spec = spec
        self.seed = 0
        self.layer = 0
        self.step = 0
        self.rank = 0
        self.tp_rank = 0  # the tensor-parallel rank, mixed into the seed (set_tensor_parallel)
        self.amax_reduction: Optional[AmaxReduction] = None  # under tensor parallelism (set_tensor_parallel)
        self.generator: Optional[torch.Generator] = None
        # int64 [1] on the weight's device; a buffer, so torch.compile takes it as a graph input
        # (the values written between micro-batches reach the compiled code); not in state_dict.
        self.register_buffer("sr_seed", None, persistent=False)

    def default_spec(self) -> LinearSpec:
        """The spec of a layer built without one: every GEMM in high precision."""
        return LinearSpec()

    # ------------------------------------------------------------------ state the recipe drives
    def set_high_precision(self, gemms: Iterable[str] = GEMMS) -> None:
        """Late switch (paper, App. D): run these GEMMs ('fprop', 'dgrad', 'wgrad') in the compute dtype."""
        gemms = tuple(gemms)
        unknown = [gemm for gemm in gemms if gemm not in GEMMS]
        if unknown:
            raise ValueError(f"layer {self.name!r}: unknown GEMMs {unknown}; expected a subset of {GEMMS}")
        self.spec = dataclasses.replace(self.spec, **{gemm: None for gemm in gemms})

    def set_tensor_parallel(self, role: str, group, tp_rank: int) -> None:
        """Shard this layer over a tensor-parallel group: ``role`` 'column' (W sharded along out_features)
        or 'row' (along in_features).

        The operands sharded in that role take the group's per-tensor amax (``TP_AMAX_OPERANDS``), so
        with round-to-nearest every quantized value is the one the unsharded layer computes for that
        slice (given whole blocks per shard, which trainer/tensor_parallel.py checks). Stochastic
        rounding mixes ``tp_rank`` into the seed, so the shards draw independently: an SR run under
        tensor parallelism is not bit-identical to the unsharded run (its RNE operands are).
        """
        if role not in TP_AMAX_OPERANDS:
            raise ValueError(f"layer {self.name!r}: tensor-parallel role must be one of {tuple(TP_AMAX_OPERANDS)}, "
                             f"got {role!r}")
        self.amax_reduction = AmaxReduction(group, TP_AMAX_OPERANDS[role])
        self.tp_rank = int(tp_rank)  # in the seed from the next set_step on

    def set_seed(self, seed: int, layer: int = 0) -> None:
        """The run's seed and this layer's index, from which ``set_step`` derives each step's draws."""
        self.seed, self.layer = int(seed), int(layer)

    def set_step(self, step: int, rank: int = 0) -> None:
        """This optimizer step's seed (its first micro-batch's) into ``sr_seed``, when the spec rounds
        stochastically."""
        self.step, self.rank = int(step), int(rank)
        self.set_micro_step(0)

    def set_micro_step(self, micro_step: int) -> None:
        """Write micro-batch ``micro_step``'s seed of the current step into ``sr_seed``: one fill on
        the device, no host sync, the same tensor every time (CUDA graphs keep its address)."""
        if not self.spec.stochastic:
            return
        device = self.weight.device
        if self.sr_seed is None or self.sr_seed.device != device:
            self.sr_seed = torch.zeros(1, dtype=torch.int64, device=device)
        seed = mix_seed(self.seed, self.layer, self.step, self.rank, micro_step, self.tp_rank) % (1 << SEED_BITS)
        self.sr_seed.fill_(seed)

    def rounding_rng(self):
        """What stochastic rounding draws from: ``generator``, else ``sr_seed``, else None (global RNG)."""
        return self.generator if self.generator is not None else self.sr_seed

    # ------------------------------------------------------------------ forward
    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The GEMM dtype: autocast's when autocast is on for x's device, else x's dtype."""
        if torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
        return x.dtype

    def gemms_to_check(self, x: torch.Tensor) -> LinearSpec:
        """The GEMMs whose operands the forward checks (default: all that the spec quantizes)."""
        return self.spec

    def local_features(self):
        """(in_features, out_features) of the GEMMs this rank runs: the local weight's (a tensor-parallel
        shard's), else the layer's."""
        weight = local_tensor(self.weight)
        return weight.shape[1], weight.shape[0]

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError naming the layer if x does not fit the quantized GEMMs."""
        in_features, out_features = self.local_features()
        if x.shape[-1] != in_features:
            raise ValueError(f"layer {self.name!r}: input last dim {x.shape[-1]} != in_features {in_features}")
        tokens = x.numel() // in_features
        check_linear_shapes(self.gemms_to_check(x), tokens, in_features, out_features, self.name)

    @property
    def moves_sequence(self) -> bool:
        """Whether the layer gathers its input or scatters its output along the sequence itself (tensor
        parallelism): then ``quantized_matmul`` runs even when no GEMM is quantized (a late switch to BF16),
        since a plain F.linear would skip those collectives."""
        return False

    def quantized_matmul(self, x: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        """x [..., K] times W^T with the spec's quantized GEMMs -> [..., N] in the compute dtype (the backend)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement quantized_matmul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under tensor parallelism the weight (and bias) are DTensors: the GEMMs take the local shard.
        bias = local_tensor(self.bias) if self.bias is not None else None
        if not self.spec.quantized and not self.moves_sequence:
            return F.linear(x, local_tensor(self.weight), bias)
        self.check_input(x)
        compute_dtype = self.compute_dtype(x)
        with autocast_off(x.device.type):
            out = self.quantized_matmul(x, compute_dtype)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, name={self.name!r}, spec=({self.spec.describe()})"


class NativeQuantizedLinear(QuantizedLinear):
    """A layer whose quantized GEMMs run natively through torch's scaled matmul (models.quant.fp8_torch,
    models.quant.nvfp4_torch): its spec is the emulated path's LinearSpec, checked on assignment by the
    backend's ``check_spec`` (whether the GEMM takes that format, tile and rounding), and only the GEMMs that
    will run are checked against an input."""

    @staticmethod
    def check_spec(spec: LinearSpec, name: str = "") -> None:
        raise NotImplementedError("a native backend names its spec check")

    @property
    def spec(self) -> LinearSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: LinearSpec) -> None:
        self.check_spec(spec, self.name)
        self._spec = spec

    def gemms_to_check(self, x: torch.Tensor) -> LinearSpec:
        """The GEMMs that will run: Dgrad and Wgrad only when their gradients are wanted."""
        grad_enabled = torch.is_grad_enabled()
        spec = self.spec
        return LinearSpec(
            fprop=spec.fprop,
            dgrad=spec.dgrad if grad_enabled and x.requires_grad else None,
            wgrad=spec.wgrad if grad_enabled and self.weight.requires_grad else None,
        )
