"""Check a whole `TrainConfig` at start, before any data is read or any model is built.

Every rule raises a `ConfigError` (a ValueError) whose message begins with the dotted field
name as it is written on the command line (`train.steps`, `optim.lr`), the value it got, and
what it must be. The component checks that already exist (ModelConfig.validate, the data and
precision validators) run from here too, so that every config mistake surfaces before the
first expensive step; checks that need the world size (global batch divisibility) stay in the
loop, which knows it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

from trainer.config import TrainConfig


class ConfigError(ValueError):
    """A config value is out of range; the message names the field."""


def _require(condition: bool, field: str, value, must: str) -> None:
    if not condition:
        raise ConfigError(f"{field} must be {must}, got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_ints(cfg_part, prefix: str, names: Iterable[str]) -> None:
    for name in names:
        value = getattr(cfg_part, name)
        _require(_is_int(value) and value >= 1, f"{prefix}.{name}", value, "a positive integer")


def _non_negative_ints(cfg_part, prefix: str, names: Iterable[str]) -> None:
    for name in names:
        value = getattr(cfg_part, name)
        _require(_is_int(value) and value >= 0, f"{prefix}.{name}", value, "an integer >= 0 (0 disables)")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_train_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the first bad field of `cfg`; return None when every field is in range."""
    _validate_loop(cfg)
    _validate_optim(cfg)
    _validate_checkpoint(cfg)
    _validate_logging(cfg)
    _validate_parallel(cfg)
    _validate_components(cfg)


def _validate_loop(cfg: TrainConfig) -> None:
    train = cfg.train
    _positive_ints(train, "train", ("steps", "micro_batch_size", "global_batch_size", "max_consecutive_skips"))
    _non_negative_ints(train, "train", ("eval_every",))
    if train.eval_every > 0:
        _positive_ints(train, "train", ("eval_batches",))
    if train.global_batch_size % train.micro_batch_size:
        raise ConfigError(
            f"train.global_batch_size ({train.global_batch_size}) must be a multiple of "
            f"train.micro_batch_size ({train.micro_batch_size})"
        )
    _require(train.batch_policy in ("nearest", "exact"), "train.batch_policy", train.batch_policy, "'nearest' or 'exact'")
    _require(_finite(train.batch_tolerance) and 0 <= train.batch_tolerance < 1, "train.batch_tolerance",
             train.batch_tolerance, "a fraction in [0, 1)")
    _require(_finite(train.spike_factor) and train.spike_factor > 1.0, "train.spike_factor", train.spike_factor,
             "a finite number > 1 (a spike is a loss this many times its running mean)")
    if train.preflight_memory_gib is not None:
        _require(_finite(train.preflight_memory_gib) and train.preflight_memory_gib > 0, "train.preflight_memory_gib",
                 train.preflight_memory_gib, "a number of GiB > 0, or null (the device's own memory)")
    for index, batch in enumerate(train.skip_batches):
        _require(_is_int(batch) and batch >= 0, f"train.skip_batches[{index}]", batch,
                 "a global batch index >= 0 (as in the 'batch' field of skipped_step events)")


def _validate_optim(cfg: TrainConfig) -> None:
    optim = cfg.optim
    _require(_finite(optim.lr) and optim.lr > 0, "optim.lr", optim.lr, "a finite number > 0")
    _require(_finite(optim.min_lr) and 0 <= optim.min_lr <= optim.lr, "optim.min_lr", optim.min_lr,
             f"a finite number in [0, optim.lr={optim.lr}]")
    _require(_finite(optim.beta1) and 0 <= optim.beta1 < 1, "optim.beta1", optim.beta1, "in [0, 1)")
    _require(_finite(optim.beta2) and 0 <= optim.beta2 < 1, "optim.beta2", optim.beta2, "in [0, 1)")
    _require(_finite(optim.eps) and optim.eps > 0, "optim.eps", optim.eps, "a finite number > 0")
    _require(_finite(optim.weight_decay) and optim.weight_decay >= 0, "optim.weight_decay", optim.weight_decay,
             "a finite number >= 0")
    _require(_finite(optim.grad_clip) and optim.grad_clip >= 0, "optim.grad_clip", optim.grad_clip,
             "a finite number >= 0 (0 disables clipping)")
    _non_negative_ints(optim, "optim", ("warmup_steps",))
    _require(_finite(optim.decay_fraction) and 0 <= optim.decay_fraction <= 1, "optim.decay_fraction",
             optim.decay_fraction, "in [0, 1]")
    _require(optim.schedule in ("wsd", "cosine", "constant"), "optim.schedule", optim.schedule,
             "one of 'wsd', 'cosine', 'constant'")
    _require(optim.decay_shape in ("linear", "cosine", "1-sqrt"), "optim.decay_shape", optim.decay_shape,
             "one of 'linear', 'cosine', '1-sqrt'")
    _require(optim.name == "adamw", "optim.name", optim.name, "'adamw'")


def _validate_checkpoint(cfg: TrainConfig) -> None:
    checkpoint = cfg.checkpoint
    _non_negative_ints(checkpoint, "checkpoint", ("every", "keep"))
    _require(_finite(checkpoint.every_minutes) and checkpoint.every_minutes >= 0, "checkpoint.every_minutes",
             checkpoint.every_minutes, "a number of minutes >= 0 (0 disables)")
    _require(bool(checkpoint.resume), "checkpoint.resume", checkpoint.resume, "'auto', 'none' or a checkpoint path")
    _require(checkpoint.on_corrupt in ("fallback", "stop"), "checkpoint.on_corrupt", checkpoint.on_corrupt,
             "'fallback' or 'stop'")
    _require(checkpoint.export_hf_dtype in ("bfloat16", "float16", "float32"), "checkpoint.export_hf_dtype",
             checkpoint.export_hf_dtype, "one of 'bfloat16', 'float16', 'float32'")
    if checkpoint.init_from_hf:
        directory = Path(checkpoint.init_from_hf).expanduser()
        _require((directory / "config.json").is_file(), "checkpoint.init_from_hf", checkpoint.init_from_hf,
                 "a Hugging Face NemotronH directory (config.json + safetensors); it has no config.json")


def _validate_logging(cfg: TrainConfig) -> None:
    _positive_ints(cfg.logging, "logging", ("log_every",))
    _non_negative_ints(cfg.logging, "logging", ("quant_diagnostics_every",))
    _require(cfg.logging.wandb.mode in ("online", "offline", "disabled"), "logging.wandb.mode", cfg.logging.wandb.mode,
             "one of 'online', 'offline', 'disabled'")


def _validate_parallel(cfg: TrainConfig) -> None:
    parallel = cfg.parallel
    _require(_finite(parallel.collective_timeout_s) and parallel.collective_timeout_s > 0,
             "parallel.collective_timeout_s", parallel.collective_timeout_s, "a finite number of seconds > 0")
    _require(_is_int(parallel.dp_shard) and (parallel.dp_shard >= 1 or parallel.dp_shard == -1), "parallel.dp_shard",
             parallel.dp_shard, "a positive integer or -1 (all ranks)")
    _require(_is_int(parallel.dp_replicate) and (parallel.dp_replicate >= 1 or parallel.dp_replicate == -1),
             "parallel.dp_replicate", parallel.dp_replicate, "a positive integer or -1")
    _require(isinstance(parallel.auto, bool), "parallel.auto", parallel.auto, "true or false")
    _require(_is_int(parallel.tp) and parallel.tp >= 1, "parallel.tp", parallel.tp, "a positive integer (1: no tensor parallelism)")
    _require(_is_int(parallel.cp) and parallel.cp >= 1, "parallel.cp", parallel.cp,
             "a positive integer (1: no context parallelism)")
    _require(parallel.reshard in ("per_micro_batch", "per_step"), "parallel.reshard", parallel.reshard,
             "'per_micro_batch' or 'per_step'")
    _require(parallel.grad_reduce in ("per_step", "per_micro_batch"), "parallel.grad_reduce", parallel.grad_reduce,
             "'per_step' or 'per_micro_batch'")
    if parallel.tp > 1:
        problem = tensor_parallel_problem(cfg.model, parallel.tp, cfg.data.seq_len)
        if problem:
            raise ConfigError(f"parallel.tp={parallel.tp}: {problem}")
        _require(parallel.fsdp != "off", "parallel.fsdp", parallel.fsdp, "'auto' or 'on' with parallel.tp > 1")
        _require(not parallel.cuda_graph, "parallel.cuda_graph", parallel.cuda_graph, "false with parallel.tp > 1")
        if cfg.precision.backend == "te" and cfg.precision.format != "bf16":
            from models.quant.recipe import TE_UNDER_TP

            raise ConfigError(TE_UNDER_TP)
    if parallel.cp > 1:
        problem = context_parallel_problem(parallel.cp, parallel.tp, cfg.data.seq_len, cfg.model)
        if problem:
            raise ConfigError(f"parallel.cp={parallel.cp}: {problem}")
        _require(parallel.fsdp != "off", "parallel.fsdp", parallel.fsdp, "'auto' or 'on' with parallel.cp > 1")
        _require(not parallel.cuda_graph, "parallel.cuda_graph", parallel.cuda_graph, "false with parallel.cp > 1")
    if parallel.gather_nvfp4_weights:  # where no layer can take codes the flag does nothing (said at start)
        precision = cfg.precision
        for field in ("switch_to_bf16_at_step", "switch_to_bf16_at_tokens"):
            _require(getattr(precision, field) is None, f"precision.{field}", getattr(precision, field),
                     "unset with parallel.gather_nvfp4_weights (layers switched to BF16 need their BF16 weights, "
                     "not codes; or set parallel.gather_nvfp4_weights=false)")
    if parallel.cuda_graph:  # the rest (world size, backend) is checked once they are known
        _require(parallel.device != "cpu", "parallel.device", parallel.device, "'auto' or 'cuda' with parallel.cuda_graph")
        _require(parallel.fsdp != "on", "parallel.fsdp", parallel.fsdp,
                 "'auto' (one process) or 'off' with parallel.cuda_graph (collectives are not recorded)")
        _require(parallel.activation_checkpoint == "none", "parallel.activation_checkpoint",
                 parallel.activation_checkpoint, "'none' with parallel.cuda_graph (not tested together)")


def tensor_parallel_problem(model, tp: int, seq_len: int) -> str:
    """Why ``model`` cannot be split over ``tp`` ranks ('' when it can).

    Every sharded dimension divides evenly: the vocabulary (the embedding's rows), attention heads and KV
    heads, the MLP's hidden width, Mamba-2 groups (and so its heads), and the sequence (sequence parallelism splits the tokens of the norms and
    residual). That each rank's share of a quantized linear keeps whole quantization blocks is checked
    by the tensor-parallel pass, which knows the precision plan.
    """
    symbols = set(model.pattern)
    checks = [("data.seq_len", seq_len), ("model.vocab_size", model.vocab_size)]
    if "*" in symbols:
        checks += [("model.num_attention_heads", model.num_attention_heads),
                   ("model.num_key_value_heads", model.num_key_value_heads)]
    if "-" in symbols:
        checks.append(("model.ffn_hidden_size", model.ffn_hidden_size))
    if "M" in symbols:
        checks += [("model.mamba_num_groups", model.mamba_num_groups),
                   ("model.mamba_num_heads", model.mamba_num_heads)]
    for field, value in checks:
        if value % tp:
            return f"{field} ({value}) is not divisible by the tensor-parallel degree"
    return ""


def context_parallel_problem(cp: int, tp: int, seq_len: int, model=None) -> str:
    """Why sequences of ``seq_len`` tokens cannot be split over ``cp`` context-parallel ranks ('' when they can):
    each rank takes seq_len / cp consecutive tokens, at least the K-1 tokens a Mamba conv of ``model`` passes
    to the next piece, and under tensor parallelism its tp ranks split that piece again (sequence
    parallelism)."""
    if seq_len % cp:
        return f"data.seq_len ({seq_len}) is not divisible by the context-parallel degree"
    halo = model.conv_kernel - 1 if model is not None and "M" in model.pattern else 0
    if seq_len // cp < halo:
        return (f"a rank's piece of a sequence, data.seq_len / parallel.cp = {seq_len // cp} tokens, is shorter than "
                f"the {halo} tokens each Mamba conv (model.conv_kernel {model.conv_kernel}) passes to the next piece")
    if (seq_len // cp) % tp:
        return (f"a rank's piece of a sequence, data.seq_len / parallel.cp = {seq_len // cp} tokens, is not "
                f"divisible by parallel.tp ({tp}), which splits it again between the mixers")
    return ""


def _validate_components(cfg: TrainConfig) -> None:
    """The component configs' own validators (their messages name their fields)."""
    from data.validate import validate_data_config
    from models.quant.recipe import validate_config as validate_precision_config

    try:
        cfg.model.validate()
    except ValueError as error:  # ModelConfig names fields as 'ModelConfig.x'; say 'model.x' as typed
        raise ConfigError(str(error).replace("ModelConfig.", "model.")) from error
    for validate in (lambda: validate_data_config(cfg.data), lambda: validate_precision_config(cfg.precision)):
        try:
            validate()
        except ValueError as error:
            raise ConfigError(str(error)) from error
    problem = token_blocking_problem(cfg)
    if problem:
        raise ConfigError(problem)


def token_blocking_problem(cfg: TrainConfig) -> str:
    """Why a micro-batch's tokens cannot be cut into the quantized weight-gradient GEMMs' blocks ('' when they can).

    A quantized wgrad GEMM reduces over the tokens (micro_batch_size x seq_len, flattened) in blocks of the
    format's block edge (NVFP4 16, MX 32, FP8 block 128) and pads nothing, so the first backward would fail.
    Only when some layer is quantized: the plan is made on a meta model (no memory) when the sizes disagree.
    """
    from models.quant.format_registry import FORMAT_SPECS

    precision = cfg.precision
    if precision.format == "bf16" or not precision.quantize_wgrad or precision.format not in FORMAT_SPECS:
        return ""
    edge = FORMAT_SPECS[precision.format].block_edge
    cp = cfg.parallel.cp if _is_int(cfg.parallel.cp) and cfg.parallel.cp >= 1 else 1
    tokens = cfg.train.micro_batch_size * cfg.data.seq_len // cp  # a context-parallel rank's piece
    if tokens % edge == 0:
        return ""
    import torch

    from models import build_model
    from models.quant.recipe import plan_layers

    with torch.device("meta"):
        quantized = [plan.name for plan in plan_layers(build_model(cfg.model), precision)
                     if plan.gemm_formats.get("wgrad", "bf16") != "bf16"]
    if not quantized:
        return ""
    held = (f"train.micro_batch_size x data.seq_len = {cfg.train.micro_batch_size} x {cfg.data.seq_len}"
            if cp == 1 else f"train.micro_batch_size x data.seq_len / parallel.cp = {cfg.train.micro_batch_size} x "
                            f"{cfg.data.seq_len} / {cp}")
    return (f"data.seq_len={cfg.data.seq_len}: a micro-batch holds {held} = {tokens} tokens, not a multiple of {edge}, the "
            f"{precision.format} block the weight-gradient GEMMs of {len(quantized)} quantized layers (e.g. "
            f"{quantized[0]}) reduce over; choose data.seq_len (or train.micro_batch_size) so that the product is a "
            f"multiple of {edge}, or keep those GEMMs in BF16 (precision.quantize_wgrad=false)")


def check_data_requirement(cfg: TrainConfig) -> None:
    """An experiment that names its data (``data_requirement``) refuses the builtin corpus and tokenizer.

    Runs after the preflight (trainer.loop.train): a run that cannot fit says so first. A run that gives
    data.prepared_dir, its own sources or its own tokenizer has chosen its data and passes.
    """
    data = cfg.data
    on_builtin = data.tokenizer == "builtin" and all(source.kind == "builtin" for source in data.sources)
    if cfg.data_requirement and data.prepared_dir is None and on_builtin:
        raise ConfigError(f"data.prepared_dir is not set: experiment {cfg.name!r} trains on {cfg.data_requirement} "
                          f"(the builtin corpus and tokenizer are for small runs)")
    # A source of kind builtin is the built-in corpus wherever its shards are: with data.prepared_dir set (a
    # misspelt one included) it would be prepared there, or its shards used, instead of the required corpus.
    builtin = [source.name for source in data.sources if source.kind == "builtin"]
    if cfg.data_requirement and data.prepared_dir is not None and builtin:
        where = Path(data.prepared_dir).expanduser() / builtin[0]
        found = (f"holds shards of a {_prepared_kind(where)!r} source" if (where / "manifest.json").is_file()
                 else "does not exist: the built-in corpus would be prepared there" if not where.exists()
                 else "holds no complete preparation: the built-in corpus would be prepared there")
        prepared = _prepared_sources(Path(data.prepared_dir).expanduser())
        holds = (f"; it holds the prepared source(s) {', '.join(prepared)}: name one in data.sources with the kind, "
                 "path and settings it was prepared with (e.g. data=local_jsonl data.sources.0.name=NAME "
                 "data.sources.0.path=...)" if prepared else "")
        raise ConfigError(
            f"data.prepared_dir={data.prepared_dir}: data.sources names the built-in corpus (source {builtin[0]!r}; "
            f"{where} {found}), and experiment {cfg.name!r} trains on {cfg.data_requirement}. Check the path, and "
            f"give the data config the shards there were prepared with (data=NAME or data.sources.0.*, as for "
            f"`python -m trainer.prepare_data`){holds}")


def _prepared_kind(directory: Path) -> str:
    """The source kind a prepared directory's manifest records ('?' when it cannot be read)."""
    import json

    try:
        return str(json.loads((directory / "manifest.json").read_text()).get("source", {}).get("kind", "?"))
    except (OSError, ValueError, AttributeError):
        return "?"


def _prepared_sources(directory: Path, shown: int = 5) -> list:
    """'name (kind)' of the complete prepared sources in a data.prepared_dir (at most `shown`)."""
    if not directory.is_dir():
        return []
    found = sorted(entry for entry in directory.iterdir() if (entry / "manifest.json").is_file())
    return [f"{entry.name} ({_prepared_kind(entry)})" for entry in found[:shown]] + (["..."] if len(found) > shown else [])
