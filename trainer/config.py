"""The run's configuration: one dataclass per component, composed into ``TrainConfig``.

``configs/train.yaml`` is validated against ``TrainConfig`` (registered here in Hydra's
ConfigStore as ``train_schema``), so a misspelt key fails at start. The entry point converts
the composed config to these dataclasses once; nothing below it reads a ``DictConfig``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from data.config import DataConfig
from models.config import ModelConfig
from models.quant.config import PrecisionConfig


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    name: str = "adamw"
    """Label of this optimizer config."""
    lr: float = 3e-3
    """Peak learning rate (reached at the end of warmup)."""
    min_lr: float = 3e-5
    """Floor the schedule decays to."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay; never applied to 1-D params (norms, biases) nor A_log, D, dt_bias."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    fused: Optional[bool] = None
    """Use the fused AdamW kernel: None picks it on CUDA, False never, True always."""
    schedule: str = "wsd"
    """Learning-rate shape: 'wsd' (warmup-stable-decay), 'cosine', or 'constant' (after warmup)."""
    warmup_steps: int = 20
    """Linear warmup from 0 to lr over this many optimizer steps."""
    decay_fraction: float = 0.2
    """WSD: the last fraction of training decays from lr to min_lr."""
    decay_shape: str = "linear"
    """WSD decay shape: 'linear', 'cosine' or '1-sqrt'."""


@dataclass
class ParallelConfig:
    """How the model is spread over devices and how memory is traded for compute."""

    name: str = "data_parallel"
    """Label of this parallel config."""
    auto: bool = False
    """Let the planner choose the layout for the launched world at start (trainer/planning/auto.py): tp,
    dp_shard, dp_replicate, train.micro_batch_size, activation_checkpoint, reshard, grad_reduce and
    reduce_dtype, the fastest plan that fits. The choice is printed, recorded in run_info.json and W&B,
    and replaces those fields; false keeps the fields as written (an explicit layout)."""
    tp: int = 1
    """Tensor-parallel degree: each block's linears split over this many GPUs of one node (attention by
    heads, the MLP by its hidden columns, Mamba-2 by groups), the norms and residual on 1/tp of the tokens
    (sequence parallelism); 1 = off. Data-parallel ranks = world size / (tp x cp)."""
    cp: int = 1
    """Context-parallel degree: every sequence of a micro-batch split along its tokens over this many GPUs
    (contiguous pieces in rank order); linears, norms and the MLP run on the local tokens, Mamba-2 passes
    its conv's last tokens and its SSD state to the next piece, attention gathers K and V
    (models/context_parallel.py); 1 = off. The cp ranks of a group read the same sequences and FSDP2
    shards over them too. Data-parallel ranks = world size / (tp x cp)."""
    reshard: str = "per_micro_batch"
    """When FSDP2 frees a block's gathered parameters: 'per_micro_batch' (after each micro-batch's forward
    and again after its backward: two all-gathers per block and micro-batch, least memory) or 'per_step'
    (kept gathered over the step's micro-batches: one all-gather per block and step, the block's unsharded
    compute copy held all step)."""
    grad_reduce: str = "per_step"
    """When FSDP2 reduce-scatters gradients: 'per_step' (the unsharded gradient accumulated over the
    micro-batches in reduce_dtype, one reduce-scatter per step) or 'per_micro_batch' (one reduce-scatter
    per micro-batch into the sharded gradient: no unsharded gradient held)."""
    dp_shard: int = -1
    """FSDP2 shard group size; -1 = all ranks (or the ranks of one node when dp_replicate > 1)."""
    dp_replicate: int = 1
    """HSDP replicas: shard within groups of dp_shard ranks, replicate across groups; -1 = world size / dp_shard."""
    fsdp: str = "auto"
    """'auto' (FSDP2 when world size > 1), 'on' (FSDP2 even on one rank), 'off'."""
    param_dtype: str = "auto"
    """Compute dtype: 'auto' (bfloat16 on GPU, float32 on CPU), bfloat16, float16 or float32.
    FP32 master weights are kept; FSDP2 casts params to it, without FSDP autocast does."""
    reduce_dtype: str = "float32"
    """Dtype of gradient reduction across ranks."""
    activation_checkpoint: str = "none"
    """'none', 'full' (every block), or a set of block symbols to recompute, e.g. 'M-' or '*'."""
    gather_nvfp4_weights: bool = False
    """Under FSDP2, gather the weights of NVFP4 linears with 16x16 weight tiles as their 4-bit codes and block
    scales (each rank quantizes its rows with the whole weight's amax): a quarter of BF16's bytes on the wire,
    the same codes the layer would make, bit for bit (trainer/nvfp4_weight_gather.py). Refused with a late
    switch to BF16; under parallel.compile those layers' GEMMs run outside the compiled graphs (a graph break
    each, a cost the planner does not model). Only the emulated and torch NVFP4 layers take codes (not
    Transformer Engine's), with 16x16 weight tiles reused by Dgrad, rows that split over a shard group of 2 or
    more in whole 16-row tiles, the LM head not; the others gather in the compute dtype as before (the start
    line says how many take codes)."""
    compile: bool = False
    """torch.compile each block (eager fallbacks where a kernel does not trace)."""
    cuda_graph: bool = False
    """Record each micro-batch's forward + backward once in a CUDA graph and replay it (one process
    on one GPU, no FSDP, no activation checkpointing): 2.8-3.5x faster steps for small, host-bound
    models; the graph's memory stays reserved for the run. trainer/cuda_graph.py."""
    device: str = "auto"
    """'auto' (cuda when available, else cpu), 'cuda' or 'cpu'."""
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait for its peers (the process-group timeout), and how long a rank's
    heartbeat may stay silent before the other ranks stop with a message naming it (trainer/heartbeat.py)."""


@dataclass
class WandbConfig:
    """Weights & Biases reporting through the real wandb library."""

    mode: str = "offline"
    """'online', 'offline' (default: written locally, sync later) or 'disabled'."""
    project: str = "hybrid-nvfp4"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (team or user); None = wandb's default."""
    group: Optional[str] = None
    """W&B group; None = the experiment name without its precision (nvfp4_12b and fp8_12b -> 12b), so a run and its baseline sit together."""
    name: Optional[str] = None
    """W&B run name; None = <experiment>-<precision>-<timestamp>."""


@dataclass
class LoggingConfig:
    """What is reported, where and how often."""

    name: str = "default"
    """Label of this logging config."""
    log_every: int = 10
    """Optimizer steps between metric lines (JSONL, W&B, progress bar)."""
    progress_bar: bool = True
    """Show a tqdm progress bar with loss, tokens/s and ETA on rank 0."""
    quant_diagnostics_every: int = 0
    """Steps between quantization diagnostics of every quantized layer; 0 disables."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """W&B settings."""


@dataclass
class CheckpointConfig:
    """Distributed checkpoints: when, where, how many."""

    dir: Optional[str] = None
    """Directory of checkpoints; None = <run dir>/checkpoints."""
    every: int = 0
    """Save every N optimizer steps; 0 = no step-count saves (every_minutes, the end and stop signals still save)."""
    every_minutes: float = 30.0
    """Also save when this many minutes of wall time have passed since the last save (rank 0's clock decides for
    every rank); 0 disables. A default run loses at most this much work to a crash. 30: a save of the 12B (148 GB
    of fp32 weights and two AdamW moments, 12 bytes per parameter) takes ~8 s per rank on 64 ranks at the 374 MB/s
    per rank and 1.3 GB/s sha256 measured for dcp.save (docs/reliability.md), ~30 s where the filesystem delivers
    only 5 GB/s in all: at most 1.7% of the run's time; the tiny model's 2.8 MB save takes 0.1-0.2 s on a CPU."""
    keep: int = 3
    """Keep the newest K complete checkpoints; older ones are deleted after a save succeeds."""
    resume: str = "auto"
    """'auto' (latest complete checkpoint in dir, if any), 'none', or a checkpoint path."""
    verify: bool = True
    """Check every file of the checkpoint against the sha256 recorded when it was saved before loading it;
    false skips the hashing (sizes are still checked) and accepts checkpoints saved without integrity.json:
    a knowing choice (docs/reliability.md)."""
    on_corrupt: str = "fallback"
    """A corrupt or incomplete newest checkpoint (resume=auto): 'fallback' sets it aside as corrupt_step_N and
    resumes from the newest intact one; 'stop' stops the run naming it. An explicit resume path always stops."""
    allow_model_change: bool = False
    """Resume into a model whose config differs from the checkpoint's: parameters with the same name and
    shape are loaded, the others keep their fresh init, the optimizer starts anew. Off: a mismatch stops."""
    allow_tokenizer_change: bool = False
    """Resume a checkpoint trained with another tokenizer (another sha256, vocabulary size or EOS id): the
    token ids then mean other text to the loaded weights. Off: such a resume stops naming both tokenizers;
    on: it goes ahead and events.jsonl records a tokenizer_changed_on_resume event with both."""
    allow_data_change: bool = False
    """Resume a checkpoint trained on another corpus (a source's prepared shards hash differently, or a source
    was added or removed): the data position then points into other data. Off: such a resume stops naming the
    sources and both manifests; on: it goes ahead and events.jsonl records a data_changed_on_resume event."""
    async_save: bool = False
    """Write checkpoints in the background (DCP async_save) while training continues."""
    save_at_end: bool = True
    """Save a checkpoint after the last step."""
    init_from_hf: Optional[str] = None
    """A Hugging Face NemotronH directory (config.json + safetensors) to start from: its weights,
    with a fresh optimizer and schedule (continued pretraining). Its config.json sets the model's
    architecture. Ignored when a checkpoint is resumed."""
    export_hf_at_end: bool = False
    """After the last step, write the model as a Hugging Face directory (weights, config.json,
    generation_config.json and the tokenizer) to export_hf_dir."""
    export_hf_dir: Optional[str] = None
    """Where export_hf_at_end writes; None = <run dir>/hf (the run's own: a later completion of the
    run replaces the export there)."""
    export_hf_overwrite: bool = False
    """Let export_hf_at_end empty a non-empty export_hf_dir (a directory of files only) at the end of
    the run. Without it a non-empty export_hf_dir is refused at start-up, before any step: an earlier
    export's stale files would be read with the new one."""
    export_hf_dtype: str = "bfloat16"
    """Weight dtype of the exported directory: bfloat16, float16 or float32."""


@dataclass
class LoopConfig:
    """The training loop: length, batch, evaluation, guards."""

    steps: int = 300
    """Optimizer steps to train for."""
    micro_batch_size: int = 8
    """Sequences per rank per forward/backward."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all ranks; a multiple of micro_batch_size * data-parallel ranks
    (world size / (parallel.tp x parallel.cp)), or else adjusted as batch_policy says."""
    batch_policy: str = "nearest"
    """When the launched world cannot run global_batch_size (not a multiple of micro_batch_size x
    data-parallel ranks): 'nearest' runs the nearest batch it can (ties go up), announced at start and
    recorded as a batch_adjusted event, if within batch_tolerance of the configured one; 'exact' refuses.
    Either refusal lists the GPU counts that run the configured batch (trainer/planning/batch.py)."""
    batch_tolerance: float = 0.05
    """'nearest' accepts a batch at most this fraction away from global_batch_size (0.05: 736 -> 768)."""
    eval_every: int = 0
    """Steps between validation-loss evaluations; 0 disables."""
    eval_batches: int = 4
    """Micro-batches per rank in each validation pass."""
    max_consecutive_skips: int = 5
    """Halt (after checkpointing) when this many steps in a row had a non-finite loss or grad norm."""
    spike_factor: float = 3.0
    """Log a loss spike when the loss exceeds this many times its running mean."""
    skip_batches: List[int] = field(default_factory=list)
    """Global batch indices to pass over without training (consumed, not learned from), e.g. the batches of
    a NaN blow-up as its skipped_step events name them; recorded in the checkpoint's trainer state."""
    preflight: bool = True
    """Plan the run for the devices it sees before building anything and stop if it cannot fit (trainer/preflight.py)."""
    preflight_memory_gib: Optional[float] = None
    """Memory per device the preflight plans for; None = what the device has (GPU memory, or the host's RAM)."""


@dataclass
class TrainConfig:
    """A training run."""

    name: Optional[str] = None
    """Name of the run's experiment; None = the +experiment choice (or 'default'). Groups W&B runs."""
    seed: int = 0
    """Seed of model init and everything else random (data order has data.seed)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    run_dir: Optional[str] = None
    """Where metrics, checkpoints, W&B files and Hydra's own .hydra/ go; None = Hydra's output
    directory (outputs/<date>/<time>, or $HYBRID_RUN_DIR)."""
    data_requirement: Optional[str] = None
    """What corpus and tokenizer the experiment trains on; set, a run on the builtin corpus and tokenizer
    without data.prepared_dir stops with it (the paper-sized experiments set it)."""


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The project's Hydra configs: beside the packages in a checkout, an editable install and the
wheel alike (pyproject.toml installs configs/ next to trainer/)."""


def _required_value(key: str):
    raise ValueError(f"{key} must be set: the chosen config marks it required; give {key}=... on the command line")


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore and the `first_set` resolver of train.yaml
    (called by the entry point and `compose`; safe to call again)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("required"):
        # ${required:data.tokenizer} in a group file: a value the user must give. A plain `???` there
        # would be dropped silently (merging MISSING onto the schema's default keeps the default).
        OmegaConf.register_new_resolver("required", _required_value)
    if not OmegaConf.has_resolver("first_set"):
        # ${first_set:a,b,...}: the first argument that is neither null nor empty. train.yaml uses it
        # to make Hydra's output directory the run directory when run_dir is given.
        OmegaConf.register_new_resolver(
            "first_set", lambda *values: next((v for v in values if v not in (None, "")), None)
        )


def compose(overrides: Sequence[str] = (), config_dir: Optional[str | os.PathLike] = None) -> TrainConfig:
    """The TrainConfig that `python -m trainer OVERRIDES...` would run, for notebooks and scripts.

    ``overrides`` are the command line's (``+experiment=quickstart``, ``model=tiny``,
    ``train.steps=3``); ``config_dir`` adds a folder of one's own configs (what ``--config-dir``
    does on the command line). ``name`` defaults to the
    experiment's, as on the command line; ``run_dir`` stays None unless given (``train`` then
    uses outputs/run). A misspelt key or an unknown group option raises Hydra's error naming it.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    register_configs()
    overrides = list(overrides)
    if config_dir is not None:
        # Searched after the project's configs, as --config-dir is: own files add new names
        # (experiment/my_run.yaml, model/my_model.yaml); a name the project has stays the project's.
        extra = Path(config_dir).expanduser().resolve()
        if not extra.is_dir():
            raise FileNotFoundError(f"config_dir {extra} is not a directory")
        quoted = str(extra).replace("\\", "\\\\").replace("'", "\\'")  # Hydra's grammar: a quoted string
        overrides.append(f"hydra.searchpath=['file://{quoted}']")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = OmegaConf.to_object(hydra_compose(config_name="train", overrides=overrides))
    if cfg.name is None:
        experiments = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")]
        cfg.name = experiments[-1] if experiments else "default"
    return cfg


def compose_option(group: str, name_or_path: str | os.PathLike, overrides: Sequence[str] = (),
                   config_dir: Optional[str | os.PathLike] = None) -> TrainConfig:
    """``compose`` with one group's option given as a name (``configs/<group>/<name>.yaml``) or a yaml file anywhere.

    A file becomes that group's option in a temporary folder of one's own configs (as
    ``--config-dir`` would hold it), so it goes through the same schema, defaults and
    interpolations as a named option. What the tools take as ``--config``/``--precision``.
    Raises FileNotFoundError naming what was looked for (and, for a name, the available ones).
    """
    import shutil
    import tempfile

    path = Path(name_or_path)
    with tempfile.TemporaryDirectory() as own_configs:
        if path.suffix in (".yaml", ".yml"):
            if config_dir is not None:
                raise ValueError("compose_option: a yaml file and config_dir cannot be combined")
            if not path.is_file():
                raise FileNotFoundError(f"{group} config file {path} not found")
            (Path(own_configs) / group).mkdir()
            shutil.copy(path, Path(own_configs) / group / "_from_file.yaml")
            name, config_dir = "_from_file", own_configs
        else:
            name = str(name_or_path)
            folders = [CONFIG_DIR / group] + ([Path(config_dir) / group] if config_dir is not None else [])
            if not any((folder / f"{name}.yaml").is_file() for folder in folders):
                available = sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})
                raise FileNotFoundError(f"{group} config {name!r} not found in {CONFIG_DIR / group}; "
                                        f"available: {available}")
        return compose([f"{group}={name}", *overrides], config_dir=config_dir)


TRAIN_LEVEL_OVERRIDES = ("data.", "data=", "+data", "experiment=", "+experiment=", "~")
"""Overrides compose_data passes on as they are; any other key is a DataConfig key (gets `data.`)."""


def compose_data(config: Optional[str | os.PathLike] = None, overrides: Sequence[str] = (),
                 validate: bool = True) -> DataConfig:
    """The DataConfig a training run reads with ``data=<config>`` and these overrides (python -m trainer.prepare_data).

    ``config`` is a name under configs/data/ or a yaml file (None: the default, train.yaml's);
    ``overrides`` are DataConfig keys (``num_proc=3``) or train-level ones (``+experiment=...``,
    ``data.*``). Raises ValueError for an override that is not key=value, FileNotFoundError for a
    config that is not there, Hydra's error for an unknown key; with ``validate``, data's own
    checks run too (``data.validate_data_config``).
    """
    from data import validate_data_config

    hydra_overrides = [o if o.startswith(TRAIN_LEVEL_OVERRIDES) else f"data.{o}" for o in overrides]
    for override in hydra_overrides:
        if "=" not in override and not override.startswith("~"):
            raise ValueError(f"override {override!r} is not key=value")
    cfg = (compose_option("data", config, hydra_overrides) if config is not None else compose(hydra_overrides)).data
    if validate:
        validate_data_config(cfg)
    return cfg
