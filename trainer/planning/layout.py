"""How a run spreads over its devices, resolved from the config alone: what the memory and time models read.

`resolve_layout(cfg, gpu, gpus, gpus_per_node)` applies the trainer's own rules without a process
group: FSDP2 on or off (`parallel.fsdp`), the shard and replica sizes of the mesh
(`trainer.distributed.build_mesh`), gradient accumulation (`loop._batch_arithmetic`), the compute
and residual dtypes (`distributed.resolve_dtype`: bf16 on a GPU, fp32 on the CPU), which blocks
recompute their activations (`parallel.activation_checkpoint`), and the format and backend of
every GEMM (`models.quant.recipe.plan_layers`, asked on a model built on the meta device, as the
GEMM report asks it). A layout the trainer would refuse raises `ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from models.config import ModelConfig
from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.gemm_costs import FORMAT_COSTS, RECIPE_FORMATS, recipe_gemm_formats
from trainer.validate import ConfigError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class RunLayout:
    """The run's shape on its devices (every size per GPU unless named otherwise)."""

    gpu: GpuSpec
    gpus: int
    """World size: data-parallel ranks, one per GPU."""
    gpus_per_node: int
    """GPUs of one node (the NVLink domain an HSDP shard group should sit in)."""
    fsdp: bool
    shard: int
    """FSDP2 shard group size (1 without FSDP)."""
    replicate: int
    """HSDP replicas (1: plain FSDP)."""
    micro_batch: int
    seq_len: int
    accumulation: int
    """Micro-batches per optimizer step on each rank."""
    compute_bytes: int
    """Bytes per element of activations and compute weights (parallel.param_dtype)."""
    residual_bytes: int
    """Bytes per element of the residual stream: fp32 master weights under autocast, else the compute dtype."""
    reduce_bytes: int
    """Bytes per element of gradient reduction (parallel.reduce_dtype)."""
    checkpointed: str
    """Block symbols whose activations are recomputed in backward ('' for none, 'M*-' for all)."""
    compiled: bool
    cuda_graph: bool
    backend: str
    """'none' (bf16), 'native' (quantized GEMMs at the format's tensor-core rate) or 'emulated' (BF16 GEMMs
    on dequantized operands: formats the GPU lacks, the CPU, or precision.backend=emulated)."""
    gemm_formats: Dict[str, Dict[str, str]] = field(default_factory=dict)
    """Linear name -> {fprop|dgrad|wgrad: cost-model format or 'bf16'}, as the precision pass plans it."""

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    def linear_format(self, name: str) -> str:
        """The format of a linear's Fprop ('bf16' when it is not quantized)."""
        return self.gemm_formats.get(name, {}).get("fprop", "bf16")


def _config_error(message: str) -> ConfigError:
    return ConfigError(message)


def mesh_sizes(cfg: TrainConfig, gpus: int) -> tuple[bool, int, int]:
    """(FSDP on, shard size, replicas) as trainer.distributed decides them at this world size."""
    parallel = cfg.parallel
    fsdp_mode = {"True": "on", "False": "off", "true": "on", "false": "off"}.get(str(parallel.fsdp), parallel.fsdp)
    if fsdp_mode not in ("auto", "on", "off"):
        raise _config_error(f"parallel.fsdp must be auto, on or off; got {parallel.fsdp!r}")
    if fsdp_mode == "off" and gpus > 1:
        raise _config_error("parallel.fsdp=off needs world size 1 (data parallelism here is FSDP2/HSDP)")
    fsdp = fsdp_mode == "on" or (fsdp_mode == "auto" and gpus > 1)
    if not fsdp:
        return False, 1, 1
    if parallel.dp_replicate > 0:
        replicate = parallel.dp_replicate
        shard = parallel.dp_shard if parallel.dp_shard > 0 else gpus // replicate
    elif parallel.dp_shard > 0:
        shard = min(parallel.dp_shard, gpus)
        replicate = gpus // shard
    else:
        raise _config_error("parallel.dp_replicate=-1 needs a positive parallel.dp_shard (e.g. GPUs per node)")
    if replicate * shard != gpus:
        raise _config_error(f"parallel.dp_replicate ({replicate}) x parallel.dp_shard ({shard}) must equal the "
                            f"world size ({gpus})")
    return True, shard, replicate


def checkpointed_symbols(which: str) -> str:
    """parallel.activation_checkpoint as the set of recomputed block symbols."""
    if which == "none":
        return ""
    if which == "full":
        return "M*-"
    unknown = set(which) - set("M*-")
    if unknown:
        raise _config_error(f"parallel.activation_checkpoint must be 'none', 'full' or block symbols from 'M*-'; "
                            f"got {which!r}")
    return which


_FORMATS_CACHE: Dict[str, Dict[str, Dict[str, str]]] = {}


def gemm_formats(model: ModelConfig, precision) -> Dict[str, Dict[str, str]]:
    """recipe_gemm_formats, once per (model, recipe): each call builds the model on the meta device."""
    key = repr((model, precision))
    if key not in _FORMATS_CACHE:
        try:
            _FORMATS_CACHE[key] = recipe_gemm_formats(model, precision)
        except ValueError as error:  # a layer the recipe cannot quantize, a bad dimension: the field is named
            raise _config_error(str(error)) from error
    return _FORMATS_CACHE[key]


def _backend(cfg: TrainConfig, gpu: GpuSpec) -> str:
    precision = cfg.precision
    if precision.format == "bf16":
        return "none"
    fmt = RECIPE_FORMATS.get(precision.format)
    if fmt is None:
        raise _config_error(f"precision.format {precision.format!r} has no cost model; known: {sorted(RECIPE_FORMATS)}")
    native = FORMAT_COSTS[fmt].peak_key in gpu.peak_flops and gpu.name != "CPU"
    return "native" if native and precision.backend != "emulated" else "emulated"


def resolve_layout(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                   model: Optional[ModelConfig] = None) -> RunLayout:
    """The layout of ``cfg`` on ``gpus`` devices like ``gpu`` (``model`` replaces cfg.model, e.g. adopted from HF)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    model = model or cfg.model
    fsdp, shard, replicate = mesh_sizes(cfg, gpus)
    micro, global_batch = cfg.train.micro_batch_size, cfg.train.global_batch_size
    if global_batch % (micro * gpus):
        raise _config_error(f"train.global_batch_size ({global_batch}) must be a multiple of train.micro_batch_size "
                            f"({micro}) x data-parallel ranks ({gpus})")
    on_cpu = gpu.name == "CPU"
    param_dtype = cfg.parallel.param_dtype
    compute = DTYPE_BYTES["float32" if on_cpu else "bfloat16"] if param_dtype == "auto" else DTYPE_BYTES.get(param_dtype)
    if compute is None:
        raise _config_error(f"parallel.param_dtype must be auto, bfloat16, float16 or float32; got {param_dtype!r}")
    reduce_bytes = DTYPE_BYTES.get(cfg.parallel.reduce_dtype)
    if reduce_bytes is None:
        raise _config_error(f"parallel.reduce_dtype must be bfloat16, float16 or float32; got {cfg.parallel.reduce_dtype!r}")
    return RunLayout(
        gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node or min(gpus, gpu.nvlink_domain if not on_cpu else gpus),
        fsdp=fsdp, shard=shard, replicate=replicate, micro_batch=micro, seq_len=cfg.data.seq_len,
        accumulation=global_batch // (micro * gpus), compute_bytes=compute,
        # Without FSDP the FP32 master weights run under autocast: the embedding (not autocast) and the
        # residual adds stay FP32. FSDP2 casts the parameters themselves to param_dtype.
        residual_bytes=compute if fsdp else 4, reduce_bytes=reduce_bytes,
        checkpointed=checkpointed_symbols(cfg.parallel.activation_checkpoint),
        compiled=cfg.parallel.compile, cuda_graph=cfg.parallel.cuda_graph, backend=_backend(cfg, gpu),
        gemm_formats=gemm_formats(model, cfg.precision),
    )
