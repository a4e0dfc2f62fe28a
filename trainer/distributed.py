"""Process group, device mesh and the `parallelize` pass.

Launch modes, all read from the environment torchrun (or srun + torchrun) sets:
  single process   no RANK/WORLD_SIZE: world size 1, no process group (or, with parallel.fsdp=on, a
                   process group of one on an in-memory store, so the FSDP2 path runs without torchrun)
  torchrun         RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT (c10d rendezvous)
The mesh: world = dp_replicate x dp_shard x cp x tp, tensor parallelism innermost (the tp ranks of a
group are consecutive, so they share a node and its NVLink), context parallelism next. Data-parallel
rank and size count the (dp_replicate, dp_shard) position only: the tp and cp ranks of one group read
the same sequences (each cp rank its own piece of their tokens). FSDP2 shards over dp_shard x cp: the cp
ranks hold the same parameters, and each contributes the gradient of its tokens.
Backend: NCCL on CUDA, gloo on CPU. Joining the group and every collective after it are bounded
by parallel.collective_timeout_s; a heartbeat thread names a stalled or dead rank within the same
time (trainer/heartbeat.py).

`parallelize` applies, in this order (torchtitan's order; each step needs the one before):
  1. precision conversion (nn.Linear -> QuantLinear by name; done by the caller, see loop.py)
  2. tensor parallelism when parallel.tp > 1 (trainer/tensor_parallel.py: DTensor parameters on the tp
     mesh, sequence parallelism between the mixers); context parallelism when parallel.cp > 1
     (trainer/context_parallel.py: the mixers exchange what crosses a piece boundary)
  3. activation checkpointing per block (full, or only blocks of given symbols)
  4. torch.compile per block (`module.compile()` keeps parameter names; trainer/compile.py)
  5. FSDP2 `fully_shard` on the embedding, each block and the head (norm_f + lm_head), then the root,
     over the data-parallel mesh (dp_shard x cp); HSDP when
     dp_replicate > 1. parallel.reshard decides whether a block's gathered parameters are freed
     after each micro-batch's forward and backward or kept over the step (`set_fsdp_micro_step`)
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from trainer.compile import apply_compile
from trainer.config import ParallelConfig
from trainer.heartbeat import Heartbeat

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

_timeout_s = 1800.0  # the process group's timeout (torch's default until init_distributed sets ours)
_heartbeat = None  # this process's Heartbeat while it is in a process group of several ranks


@dataclass
class DistEnv:
    """Where this process sits: rank, world size, device, and the mesh."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    mesh: Optional[object] = None
    """DeviceMesh named ('dp_replicate'?, 'dp_shard', 'cp'?, 'tp'?) (a dim of size 1 left out); None without a
    process group."""
    tp: int = 1
    """Tensor-parallel degree (parallel.tp)."""
    cp: int = 1
    """Context-parallel degree (parallel.cp)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: world size / (tp x cp) (each reads its own share of the batch)."""
        return self.world_size // (self.tp * self.cp)

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel index (tp innermost, then cp: the tp x cp ranks of a group share it)."""
        return self.rank // (self.tp * self.cp)

    @property
    def cp_rank(self) -> int:
        """This process's piece of each sequence: tokens [cp_rank L / cp, (cp_rank + 1) L / cp)."""
        return (self.rank // self.tp) % self.cp

    def submesh(self, *names: str):
        """The mesh over the named dims that exist (None when none does)."""
        if self.mesh is None:
            return None
        present = tuple(name for name in names if name in (self.mesh.mesh_dim_names or ()))
        return self.mesh[present] if present else None

    @property
    def tp_mesh(self):
        return self.submesh("tp")

    @property
    def cp_mesh(self):
        return self.submesh("cp")

    @property
    def dp_mesh(self):
        """The data-parallel ranks (dp_replicate x dp_shard): the gradient sync of the replicated work."""
        return self.submesh("dp_replicate", "dp_shard")

    @property
    def fsdp_mesh(self):
        """FSDP2's mesh: dp_replicate x (dp_shard x cp), the cp ranks folded into the shard dimension (they
        hold the same parameters; build_mesh flattens them as 'dp_shard_cp')."""
        if self.cp == 1 or self.mesh is None:
            return self.dp_mesh
        replicated = ("dp_replicate",) if "dp_replicate" in self.mesh.mesh_dim_names else ()
        return self.mesh[replicated + ("dp_shard_cp",)]  # a flattened dim is not among mesh_dim_names


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"parallel.device={name!r} but CUDA is not available on this machine")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ValueError(f"parallel.device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """parallel.param_dtype: 'auto' is bf16 on GPU and fp32 on CPU (bf16 matmuls are slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {name!r}")
    return _DTYPES[name]


def init_distributed(cfg: ParallelConfig) -> DistEnv:
    """Join the process group torchrun set up (or run alone) and build the data-parallel mesh."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    env = DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device, tp=cfg.tp, cp=cfg.cp)
    launched = "RANK" in os.environ
    if world_size == 1 and not launched and not fsdp_enabled(cfg, env):
        return env  # a plain `python -m trainer`: no process group (torchrun at 1 rank gets one)
    global _timeout_s, _heartbeat
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        _timeout_s = cfg.collective_timeout_s
        timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
        if launched:
            dist.init_process_group(backend=backend, timeout=timeout)
            _heartbeat = Heartbeat.from_environment(rank, world_size, cfg.collective_timeout_s)
            if _heartbeat is not None:
                _heartbeat.start()
        else:  # parallel.fsdp=on in one plain process: a group of one needs no rendezvous
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    env.mesh = build_mesh(cfg, world_size, device.type)
    return env


def process_group_timeout_s() -> float:
    """parallel.collective_timeout_s of the process group this process joined (for groups made later)."""
    return _timeout_s


def mesh_shape(cfg: ParallelConfig, world_size: int) -> tuple[int, int, int, int]:
    """(dp_replicate, dp_shard, cp, tp) for this world size, or ValueError naming the fields."""
    tp, cp = cfg.tp, cfg.cp
    if tp < 1 or world_size % tp:
        raise ValueError(f"parallel.tp ({tp}) must divide the world size ({world_size})")
    if cp < 1 or world_size % (tp * cp):
        raise ValueError(f"parallel.tp ({tp}) x parallel.cp ({cp}) must divide the world size ({world_size})")
    dp = world_size // (tp * cp)
    if cfg.dp_replicate > 0:
        replicate = cfg.dp_replicate
        shard = cfg.dp_shard if cfg.dp_shard > 0 else dp // replicate
    elif cfg.dp_shard > 0:  # dp_replicate=-1: as many replicas as the shard size allows
        shard = min(cfg.dp_shard, dp)
        replicate = dp // shard
    else:
        raise ValueError("parallel.dp_replicate=-1 needs a positive parallel.dp_shard (e.g. GPUs per node)")
    if replicate * shard * cp * tp != world_size:
        raise ValueError(
            f"parallel.dp_replicate ({replicate}) x parallel.dp_shard ({shard}) x parallel.cp ({cp}) x parallel.tp "
            f"({tp}) must equal the world size ({world_size})"
        )
    return replicate, shard, cp, tp


def build_mesh(cfg: ParallelConfig, world_size: int, device_type: str):
    """The DeviceMesh ('dp_replicate', 'dp_shard', 'cp', 'tp'), leaving out dp_replicate, cp and tp where they
    are 1; with cp > 1 also the flattened 'dp_shard_cp' FSDP2 shards over."""
    from torch.distributed.device_mesh import init_device_mesh

    replicate, shard, cp, tp = mesh_shape(cfg, world_size)
    dims = [(name, size) for name, size in (("dp_replicate", replicate), ("dp_shard", shard), ("cp", cp), ("tp", tp))
            if size > 1 or name == "dp_shard"]
    mesh = init_device_mesh(device_type, tuple(size for _, size in dims),
                            mesh_dim_names=tuple(name for name, _ in dims))
    if cp > 1:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    return mesh


def fsdp_enabled(cfg: ParallelConfig, env: DistEnv) -> bool:
    # YAML 1.1 reads an unquoted on/off as a boolean, which reaches us as "True"/"False".
    cfg.fsdp = {"True": "on", "False": "off", "true": "on", "false": "off"}.get(cfg.fsdp, cfg.fsdp)
    if cfg.fsdp not in ("auto", "on", "off"):
        raise ValueError(f"parallel.fsdp must be auto, on or off; got {cfg.fsdp!r}")
    if cfg.fsdp == "off" and env.distributed:
        raise ValueError("parallel.fsdp=off needs world size 1 (data parallelism here is FSDP2/HSDP)")
    return cfg.fsdp == "on" or (cfg.fsdp == "auto" and env.distributed)


def apply_activation_checkpointing(model: nn.Module, which: str) -> int:
    """Recompute chosen blocks in backward. `which`: 'none', 'full', or block symbols ('M', '*-').

    The block's forward is wrapped in place, so parameter names (and checkpoints) stay the same
    with and without activation checkpointing. Returns the number of wrapped blocks.
    """
    if which == "none":
        return 0
    unknown = set(which) - set("M*-") if which != "full" else set()
    if unknown:
        raise ValueError(
            f"parallel.activation_checkpoint must be 'none', 'full' or block symbols from 'M*-'; got {which!r}"
        )
    wrapped = 0
    for block in model.layers:
        if which == "full" or block.symbol in which:
            plain_forward = block.forward

            def checkpointed_forward(*args, _plain_forward=plain_forward, **kwargs):
                return checkpoint(_plain_forward, *args, use_reentrant=False, **kwargs)

            block.forward = checkpointed_forward
            wrapped += 1
    return wrapped


def apply_fsdp(model: nn.Module, env: DistEnv, cfg: ParallelConfig, param_dtype: torch.dtype) -> None:
    """FSDP2 over the data-parallel mesh, one unit each for the embedding, every block, and the head (final
    norm and LM head), then the root (no parameters of its own).

    The embedding and the head are units of their own (torchtitan's layout) rather than the root's, so
    each moves at its own point of the step: the embedding's gather before the first block's, the head's
    as the forward reaches the last blocks (FSDP2 gathers one unit ahead) and its reduce-scatter first in
    backward; under tensor parallelism the embedding is split by vocabulary rows, so its traffic is 1/tp.
    parallel.reshard='per_micro_batch' frees a unit's gathered parameters after
    its forward (all but the head and the last block, needed first in backward) and after its backward;
    'per_step' keeps every unit gathered from the step's first forward to its last backward
    (`set_fsdp_micro_step` says when to free them). The embedding is never gathered for its backward, which
    needs only the token ids and the output's gradient.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if env.mesh is None:
        raise RuntimeError("FSDP needs a process group; trainer.distributed.init_distributed makes one")
    mesh = env.fsdp_mesh
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=resolve_dtype(cfg.reduce_dtype, env.device))
    per_step = cfg.reshard == "per_step"
    fully_shard(model.embeddings, mesh=mesh, mp_policy=policy, reshard_after_forward=not per_step)
    # An embedding's backward scatters the output's gradient into rows by token id and never reads the table, so
    # a freed embedding is not gathered again for it (FSDP2 still reduce-scatters its gradient).
    model.embeddings.set_unshard_in_backward(False)
    blocks = list(model.layers)
    for index, block in enumerate(blocks):
        keep = per_step or index == len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
    fully_shard([model.norm_f, model.lm_head], mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def set_fsdp_micro_step(model: nn.Module, cfg: ParallelConfig, micro_step: int, accumulation: int) -> None:
    """Before micro-batch ``micro_step`` of ``accumulation``: whether its backward reduces gradients and frees
    the gathered parameters (always in the last micro-batch; in every one under the 'per_micro_batch'
    policies). A no-op without FSDP."""
    if not hasattr(model, "set_requires_gradient_sync"):
        return
    last = micro_step == accumulation - 1
    model.set_requires_gradient_sync(last or cfg.grad_reduce == "per_micro_batch")
    model.set_reshard_after_backward(last or cfg.reshard == "per_micro_batch")


def parallelize(model: nn.Module, cfg: ParallelConfig, env: DistEnv, seq_len: Optional[int] = None) -> dict:
    """Tensor and context parallelism, activation checkpointing, compile, FSDP2 in that order. Returns what was
    applied. ``seq_len`` (the sequences' length) lets context parallelism check its pieces and build attention's
    mask ahead, outside any compiled graph."""
    param_dtype = resolve_dtype(cfg.param_dtype, env.device)
    tensor_parallel = {}
    if env.tp > 1:
        from trainer.tensor_parallel import apply_tensor_parallel

        tensor_parallel = apply_tensor_parallel(model, env.tp_mesh)
    context_parallel = {}
    if env.cp > 1:
        from trainer.context_parallel import apply_context_parallel

        context_parallel = apply_context_parallel(model, env.cp_mesh, seq_len)
    checkpointed = apply_activation_checkpointing(model, cfg.activation_checkpoint)
    if cfg.compile:
        apply_compile(model)
    use_fsdp = fsdp_enabled(cfg, env)
    gathered_codes = []
    if use_fsdp and cfg.gather_nvfp4_weights:
        from trainer.nvfp4_weight_gather import wrap_nvfp4_weights

        mesh = env.fsdp_mesh
        gathered_codes = wrap_nvfp4_weights(model, mesh.size(mesh.ndim - 1))  # the shard group's ranks
    if use_fsdp:
        apply_fsdp(model, env, cfg, param_dtype)
    if gathered_codes:
        from trainer.nvfp4_weight_gather import install_amax_refresh

        install_amax_refresh(model, gathered_codes, param_dtype)
    return {
        "nvfp4_weights_gathered_as_codes": len(gathered_codes),
        "fsdp": use_fsdp,
        "tp": env.tp,
        "tensor_parallel": tensor_parallel,
        "cp": env.cp,
        "context_parallel": context_parallel,
        "reshard": cfg.reshard if use_fsdp else None,
        "grad_reduce": cfg.grad_reduce if use_fsdp else None,
        "param_dtype": str(param_dtype).replace("torch.", ""),
        "activation_checkpointed_blocks": checkpointed,
        "compiled": cfg.compile,
        # Without FSDP, low-precision compute comes from autocast over fp32 master weights.
        "autocast_dtype": None if use_fsdp or param_dtype == torch.float32 else param_dtype,
    }


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average a tensor over all ranks (no-op at world size 1)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG if tensor.device.type == "cuda" else dist.ReduceOp.SUM)
        if tensor.device.type != "cuda":  # gloo has no AVG
            tensor /= dist.get_world_size()
    return tensor


def broadcast_object(value, src: int = 0):
    """Rank `src`'s value on every rank."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(value) -> list:
    """Every rank's value, in rank order ([value] at world size 1)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None
    if dist.is_initialized():
        dist.destroy_process_group()
