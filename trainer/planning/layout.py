"""How a run spreads over its devices, resolved from the config alone: what the memory and time models read.

`resolve_layout(cfg, gpu, gpus, gpus_per_node)` applies the trainer's own rules without a process
group. The mesh is ``dp_replicate x dp_shard x cp x tp`` with tp innermost (a TP group is ``tp`` consecutive
ranks inside one node) and cp next; data-parallel ranks = world size / (parallel.tp x parallel.cp), over which
parallel.dp_shard and parallel.dp_replicate split as `trainer.distributed.build_mesh` splits them (dp_shard
-1: all data-parallel ranks, or dp ranks / dp_replicate), and FSDP2 shards over dp_shard x cp. Also: FSDP2 on or off (`parallel.fsdp`), when FSDP2
re-gathers parameters and reduces gradients (`parallel.reshard`, `parallel.grad_reduce`), the batch
actually run and its accumulation (`trainer.planning.batch.resolve_batch`: train.batch_policy), the compute
and residual dtypes (`distributed.resolve_dtype`: bf16 on a GPU, fp32 on the CPU), which blocks recompute
their activations (`parallel.activation_checkpoint`), and the format and backend of every GEMM
(`models.quant.recipe.plan_layers`, asked once per model and recipe on a model built on the meta device,
as the GEMM report asks it). A layout the trainer would refuse raises `ConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from models.config import ModelConfig
from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.batch import ResolvedBatch, resolve_batch
from trainer.planning.gemm_costs import FORMAT_COSTS, RECIPE_FORMATS, costs_for_recipe, recipe_gemm_formats
from trainer.planning.tensor_parallel import quantized_split_problem
from trainer.validate import ConfigError, context_parallel_problem, tensor_parallel_problem

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class RunLayout:
    """The run's shape on its devices (every size per GPU unless named otherwise)."""

    gpu: GpuSpec
    gpus: int
    """World size: tp x cp x data-parallel ranks, one rank per GPU."""
    gpus_per_node: int
    """GPUs of one node (the NVLink domain an HSDP shard group should sit in)."""
    fsdp: bool
    shard: int
    """FSDP2 shard group size, parallel.dp_shard x parallel.cp (1 without FSDP)."""
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
    tp: int = 1
    """Tensor-parallel degree (parallel.tp): the innermost mesh dimension, inside one node."""
    cp: int = 1
    """Context-parallel degree (parallel.cp): each sequence's tokens split over this many ranks (the next mesh
    dimension out from tp)."""
    reshard: str = "per_micro_batch"
    """parallel.reshard: FSDP2 gathers each unit in every micro-batch's forward and backward, or once a step."""
    grad_reduce: str = "per_step"
    """parallel.grad_reduce: FSDP2 reduce-scatters once a step (unsharded gradient accumulated) or every micro-batch."""
    batch: Optional[ResolvedBatch] = None
    """The global batch this layout runs (train.batch_policy), None only for a hand-made layout."""
    reduce_dtype: str = "float32"
    weight_reused: bool = True
    """Dgrad reuses Fprop's quantized weight (2D tiles or a tensor scale); False: W^T is quantized again."""
    saves_quantized_input: bool = True
    """A native linear keeps Wgrad's quantized X^T from the forward (Transformer Engine, the torch FP8 layer);
    False: it keeps X in the compute dtype and quantizes X^T in the backward (the torch NVFP4 layer, as the
    emulated one does)."""

    gathers_quantized_input: bool = False
    """Under tensor parallelism the torch NVFP4 layer gathers quantized operands along the sequence: a mixer's
    one column-parallel linear (Mamba's in_proj, the MLP's up_proj) its input as packed codes and scales,
    quantized from the rank's tokens, and a mixer's row-parallel linear its output's gradient
    (trainer.tensor_parallel.quantized_input_gatherer, quantized_output_scatterer); False: the mixers' inputs
    and output gradients are gathered in the compute dtype."""

    gathers_weight_codes: bool = False
    """parallel.gather_nvfp4_weights, where the layers take it (the emulated and the torch NVFP4 layers, not
    Transformer Engine's): FSDP2 gathers the NVFP4 16x16-tiled weights as codes (``code_gathered_linears``)."""

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens of a micro-batch on one context-parallel rank (its TP group's): micro_batch x seq_len / cp."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def dp_ranks(self) -> int:
        """Data-parallel ranks: world size / (tp x cp) (= shard x replicate / cp under FSDP)."""
        return self.gpus // (self.tp * self.cp)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step actually run."""
        return self.batch.global_batch if self.batch else self.micro_batch * self.dp_ranks * self.accumulation

    def work_key(self, checkpointing: bool = True, micro_batch: bool = True) -> tuple:
        """What a micro-batch's work and saved activations depend on besides the model (a cache key; the
        formats by identity: gemm_formats returns one dict per model and recipe)."""
        return (self.tp, self.cp, self.micro_batch if micro_batch else None, self.seq_len,
                self.checkpointed if checkpointing else None,
                self.compute_bytes, self.residual_bytes, self.backend, self.compiled, self.fsdp, self.weight_reused,
                self.saves_quantized_input, self.gathers_quantized_input, id(self.gemm_formats),
                self.gathers_weight_codes,  # what each rank quantizes per gather depends on how often it gathers
                (self.shard, self.reshard, self.accumulation) if self.gathers_weight_codes else None)

    def linear_format(self, name: str) -> str:
        """The format of a linear's Fprop ('bf16' when it is not quantized)."""
        return self.gemm_formats.get(name, {}).get("fprop", "bf16")


def _config_error(message: str) -> ConfigError:
    return ConfigError(message)


def mesh_sizes(cfg: TrainConfig, gpus: int) -> tuple[bool, int, int]:
    """(FSDP on, shard size, replicas) as trainer.distributed decides them at this world size.

    Shard x replicas = gpus / parallel.tp: the shard group is dp_shard x cp (the cp ranks hold the same
    parameters), the replicas dp_replicate; data-parallel ranks = gpus / (tp x cp).
    """
    parallel = cfg.parallel
    fsdp_mode = {"True": "on", "False": "off", "true": "on", "false": "off"}.get(str(parallel.fsdp), parallel.fsdp)
    if fsdp_mode not in ("auto", "on", "off"):
        raise _config_error(f"parallel.fsdp must be auto, on or off; got {parallel.fsdp!r}")
    if fsdp_mode == "off" and gpus > 1:
        raise _config_error("parallel.fsdp=off needs world size 1 (data parallelism here is FSDP2/HSDP)")
    fsdp = fsdp_mode == "on" or (fsdp_mode == "auto" and gpus > 1)
    if not fsdp:
        return False, 1, 1
    ranks = gpus // (parallel.tp * parallel.cp)
    if parallel.dp_replicate > 0:
        replicate = parallel.dp_replicate
        shard = parallel.dp_shard if parallel.dp_shard > 0 else ranks // replicate
    elif parallel.dp_shard > 0:
        shard = min(parallel.dp_shard, ranks)
        replicate = ranks // shard
    else:
        raise _config_error("parallel.dp_replicate=-1 needs a positive parallel.dp_shard (e.g. GPUs per node)")
    if replicate * shard != ranks:
        raise _config_error(f"parallel.dp_replicate ({replicate}) x parallel.dp_shard ({shard}) must equal the "
                            f"data-parallel ranks ({ranks} = world size {gpus} / (parallel.tp {parallel.tp} x "
                            f"parallel.cp {parallel.cp}))")
    return True, shard * parallel.cp, replicate


_SPLIT_CACHE: Dict[tuple, str] = {}


def _split_problem(model: ModelConfig, precision, tp: int) -> str:
    """quantized_split_problem once per (model, recipe, tp)."""
    key = (repr((model, precision)), tp)
    if key not in _SPLIT_CACHE:
        _SPLIT_CACHE[key] = quantized_split_problem(model, gemm_formats(model, precision), tp)
    return _SPLIT_CACHE[key]


def check_tensor_parallel(cfg: TrainConfig, model: ModelConfig, gpus: int, gpus_per_node: int) -> None:
    """ConfigError unless parallel.tp divides the world, fits in one node and splits the model evenly, and
    parallel.cp splits the sequence (trainer.validate.context_parallel_problem) with tp x cp dividing the world."""
    tp, cp = cfg.parallel.tp, cfg.parallel.cp
    if cp > 1:
        if gpus % (tp * cp):
            raise _config_error(f"parallel.tp ({tp}) x parallel.cp ({cp}) must divide the world size ({gpus})")
        problem = context_parallel_problem(cp, tp, cfg.data.seq_len, model)
        if problem:
            raise _config_error(f"parallel.cp={cp}: {problem}")
    if tp == 1:
        return
    if gpus % tp:
        raise _config_error(f"parallel.tp ({tp}) must divide the world size ({gpus})")
    if tp > gpus_per_node:
        raise _config_error(f"parallel.tp ({tp}) must fit in one node ({gpus_per_node} GPUs): its collectives run "
                            f"on every block")
    problem = tensor_parallel_problem(model, tp, cfg.data.seq_len) or _split_problem(model, cfg.precision, tp)
    if problem:
        raise _config_error(f"parallel.tp={tp}: {problem}")


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


def memoized(cache: dict, model: ModelConfig, layout: RunLayout, compute, *extra, checkpointing: bool = True,
             micro_batch: bool = True):
    """compute() once per (model, layout.work_key(checkpointing, micro_batch), extra); the layout's formats
    dict is kept with the value so that its id in the key cannot be reused by another dict."""
    key = (repr(model), layout.work_key(checkpointing, micro_batch), extra)
    entry = cache.get(key)
    if entry is None or entry[0] is not layout.gemm_formats:
        entry = (layout.gemm_formats, compute())
        cache[key] = entry
    return entry[1]


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
    """'none', 'native' or 'emulated' as models.quant.recipe.resolve_backend decides on this GPU. Under tensor
    parallelism only a format torch runs natively stays native (FP8 on Hopper; NVFP4 on Blackwell, through
    models.quant.nvfp4_torch): the tensor-parallel pass shards the project's own layers, not Transformer
    Engine's, so MXFP8 under tp > 1, and NVFP4 before Blackwell, are emulated."""
    from models.quant.format_registry import format_spec

    precision = cfg.precision
    if precision.format == "bf16":
        return "none"
    fmt = RECIPE_FORMATS.get(precision.format)
    if fmt is None:
        raise _config_error(f"precision.format {precision.format!r} has no cost model; known: {sorted(RECIPE_FORMATS)}")
    native = FORMAT_COSTS[fmt].peak_key in gpu.peak_flops and gpu.name != "CPU"
    if native and cfg.parallel.tp > 1:
        native = format_spec(precision.format).runs_natively("torch", gpu.capability)
    return "native" if native and precision.backend != "emulated" else "emulated"


def _saves_quantized_input(cfg: TrainConfig, backend: str) -> bool:
    """Whether the native layer that runs this recipe keeps the quantized X^T for Wgrad: not the torch NVFP4
    layer (models.quant.nvfp4_torch), which precision.backend=torch, or auto under tensor parallelism, builds."""
    from models.quant.format_registry import quantize_kernel

    torch_layer = cfg.precision.backend == "torch" or (cfg.precision.backend == "auto" and cfg.parallel.tp > 1)
    return backend == "native" and not (torch_layer and quantize_kernel(cfg.precision.format) == "nvfp4")


def _sole_linears(model: ModelConfig, parallel) -> list:
    """The name of each block's linear in ``parallel`` (COLUMN_PARALLEL or ROW_PARALLEL) when it is the
    mixer's only one there."""
    from models.gemms import block_linears

    out = []
    for index, symbol in enumerate(model.pattern):
        found = [module for module, _, _, _ in block_linears(model, symbol) if module in parallel]
        if len(found) == 1:
            out.append(f"layers.{index}.mixer.{found[0]}")
    return out


_SEQUENCE_GATHERS_CACHE: dict = {}


def _sequence_gathers(model: ModelConfig, layout: "RunLayout") -> tuple:
    """(quantized_input_gathers, quantized_output_scatters), once per model and layout."""
    from trainer.planning.parameters import COLUMN_PARALLEL, ROW_PARALLEL

    def quantized(name: str, kind: str) -> bool:
        return layout.gemm_formats.get(name, {}).get(kind, "bf16") != "bf16"

    def compute() -> tuple:
        if not layout.gathers_quantized_input or layout.tp == 1:
            return frozenset(), frozenset()
        gathers = frozenset(name for name in _sole_linears(model, COLUMN_PARALLEL) if quantized(name, "fprop"))
        scatters = frozenset(name for name in _sole_linears(model, ROW_PARALLEL)
                             if quantized(name, "dgrad") and quantized(name, "wgrad"))
        return gathers, scatters

    return memoized(_SEQUENCE_GATHERS_CACHE, model, layout, compute, checkpointing=False, micro_batch=False)


def recomputes(model: ModelConfig, layout: "RunLayout", linear: str) -> bool:
    """Whether the block of ``linear`` ('layers.<i>.mixer.<name>') recomputes its forward in the backward."""
    return model.pattern[int(linear.split(".")[1])] in layout.checkpointed


def quantized_input_gathers(model: ModelConfig, layout: "RunLayout") -> frozenset:
    """The linears that gather their sequence-parallel input quantized (``RunLayout.gathers_quantized_input``):
    a block's column-parallel linear when it is the mixer's only one and its Fprop is quantized."""
    return _sequence_gathers(model, layout)[0]


def quantized_output_scatters(model: ModelConfig, layout: "RunLayout") -> frozenset:
    """The row-parallel linears that reduce-scatter their output themselves and gather its gradient as codes
    (``RunLayout.gathers_quantized_input``): a mixer's row-parallel linear whose Dgrad and Wgrad are quantized."""
    return _sequence_gathers(model, layout)[1]


_CODES_CACHE: dict = {}


def code_gathered_linears(model: ModelConfig, layout: "RunLayout") -> Dict[str, int]:
    """The linears whose weights FSDP2 gathers as NVFP4 codes (``RunLayout.gathers_weight_codes``), name ->
    TP-local weight elements: a block linear with NVFP4 Fprop and Dgrad sharing 16x16 weight tiles whose TP-local
    rows split over a shard group of 2 or more in whole 16-row tiles (trainer.nvfp4_weight_gather's
    nvfp4_gatherable and wrap_nvfp4_weights)."""
    from trainer.planning.parameters import fsdp_units

    def compute() -> Dict[str, int]:
        if not (layout.gathers_weight_codes and layout.fsdp and layout.weight_reused and layout.shard > 1):
            return {}
        out = {}
        for unit in fsdp_units(model):
            for param in unit.params:
                name = param.name[: -len(".weight")]
                formats = layout.gemm_formats.get(name, {})
                if not (name.startswith("layers.") and param.name.endswith(".weight")
                        and formats.get("fprop") == formats.get("dgrad") == "nvfp4"):
                    continue
                rows, cols = param.local_shape(layout.tp)
                if rows % (16 * layout.shard) == 0 and cols % 16 == 0:
                    out[name] = rows * cols
        return out

    return memoized(_CODES_CACHE, model, layout, compute, layout.shard, checkpointing=False, micro_batch=False)


def code_gathered_bytes(elements: int) -> int:
    """Bytes of ``elements`` weight elements gathered as codes: two E2M1 codes a byte, an E4M3 scale per 16x16."""
    return elements // 2 + elements // 256


def resolve_layout(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                   model: Optional[ModelConfig] = None) -> RunLayout:
    """The layout of ``cfg`` on ``gpus`` devices like ``gpu`` (``model`` replaces cfg.model, e.g. adopted from HF)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    model = model or cfg.model
    on_cpu = gpu.name == "CPU"
    gpus_per_node = gpus_per_node or min(gpus, gpu.nvlink_domain if not on_cpu else gpus)
    check_tensor_parallel(cfg, model, gpus, gpus_per_node)
    fsdp, shard, replicate = mesh_sizes(cfg, gpus)
    for field_name, value, allowed in (("reshard", cfg.parallel.reshard, ("per_micro_batch", "per_step")),
                                       ("grad_reduce", cfg.parallel.grad_reduce, ("per_step", "per_micro_batch"))):
        if value not in allowed:
            raise _config_error(f"parallel.{field_name} must be one of {allowed}, got {value!r}")
    batch = resolve_batch(cfg, gpus)
    param_dtype = cfg.parallel.param_dtype
    compute = (DTYPE_BYTES["float32" if on_cpu else "bfloat16"] if param_dtype == "auto"
               else DTYPE_BYTES.get(param_dtype))
    if compute is None:
        raise _config_error(f"parallel.param_dtype must be auto, bfloat16, float16 or float32; got {param_dtype!r}")
    reduce_bytes = DTYPE_BYTES.get(cfg.parallel.reduce_dtype)
    if reduce_bytes is None:
        raise _config_error(f"parallel.reduce_dtype must be bfloat16, float16 or float32; "
                            f"got {cfg.parallel.reduce_dtype!r}")
    backend = _backend(cfg, gpu)
    return RunLayout(
        gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node,
        fsdp=fsdp, shard=shard, replicate=replicate, micro_batch=batch.micro_batch, seq_len=cfg.data.seq_len,
        accumulation=batch.accumulation, compute_bytes=compute,
        # Without FSDP the FP32 master weights run under autocast: the embedding (not autocast) and the
        # residual adds stay FP32. FSDP2 casts the parameters themselves to param_dtype.
        residual_bytes=compute if fsdp else 4, reduce_bytes=reduce_bytes,
        checkpointed=checkpointed_symbols(cfg.parallel.activation_checkpoint),
        compiled=cfg.parallel.compile, cuda_graph=cfg.parallel.cuda_graph, backend=backend,
        saves_quantized_input=_saves_quantized_input(cfg, backend),
        gathers_quantized_input=cfg.parallel.tp > 1 and backend == "native" and not _saves_quantized_input(cfg, backend),
        gemm_formats=gemm_formats(model, cfg.precision), tp=cfg.parallel.tp, cp=cfg.parallel.cp,
        reshard=cfg.parallel.reshard,
        grad_reduce=cfg.parallel.grad_reduce, batch=batch, reduce_dtype=cfg.parallel.reduce_dtype,
        weight_reused=costs_for_recipe(cfg.precision)[RECIPE_FORMATS[cfg.precision.format]].weight_transpose_invariant,
        gathers_weight_codes=(cfg.parallel.gather_nvfp4_weights and fsdp and cfg.precision.format == "nvfp4"
                              and "w" not in cfg.precision.four_over_six
                              and (backend == "emulated" or not _saves_quantized_input(cfg, backend))),
    )
