"""The run plan: parameters, memory, step time, throughput and duration of a config on N devices of a kind.

    plan = plan_run(cfg, device_spec("B200"), gpus=64)      # no model is built on a device
    plan.fits, plan.peak_memory_gib, plan.step_time_s, plan.as_dict(), plan.render()
    smallest_changes(cfg, spec, gpus)                        # what would make a run that does not fit, fit

Memory: trainer.planning.memory; time: trainer.planning.step_time (its communication from
trainer.planning.collectives); the layout both read: trainer.planning.layout; the run's start-up,
compilation and evaluation: trainer.planning.overheads. MFU is the model FLOPs of models.flops (Megatron's
hybrid formula) over the dense BF16 peak, whatever format the GEMMs run in, as the trainer's metrics
compute it. parallel=auto's choice: trainer.planning.auto.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from models.config import ModelConfig
from models.flops import count_parameters, flops_per_token
from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.layout import RunLayout, resolve_layout
from trainer.planning.memory import GIB, MemoryPlan, plan_memory
from trainer.planning.overheads import run_overheads, steps_for_tokens
from trainer.planning.step_time import H200_CALIBRATED, Efficiency, StepTime, plan_step_time
from trainer.validate import ConfigError

SCHEMA_VERSION = 2
"""Of RunPlan.as_dict (python -m trainer.plan_run --json, run_info.json): 2 added the layout's tp, reshard,
grad_reduce, the batch actually run, the collectives, the overheads, GPU-hours."""
CUDA_RESERVED_GIB = 1.5
"""Device memory the peak of allocated tensors does not show: the CUDA context, cuBLAS and NCCL workspaces."""
FRAGMENTATION = 0.05
"""Share of the rest the caching allocator may lose to fragmentation."""
HOST_RESERVED_GIB = 2.0
"""Host memory a CPU run needs beside its tensors: Python, torch, the data loader."""
SECONDS_PER_DAY = 86400.0


def usable_memory_gib(gpu: GpuSpec) -> float:
    """Memory per device the planned peak may use (the margins above)."""
    if gpu.name == "CPU":
        return max(0.0, gpu.memory_gib * (1 - FRAGMENTATION) - HOST_RESERVED_GIB)
    return max(0.0, (gpu.memory_gib - CUDA_RESERVED_GIB) * (1 - FRAGMENTATION))


def format_count(count: float) -> str:
    """12310001152 -> '12.31B', 9200000 -> '9.2M', 4096 -> '4,096'."""
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M"
    return f"{count:,.0f}"


def format_duration(seconds: float) -> str:
    """Seconds in the unit a reader wants: '45 s', '3.2 min', '5.1 h', '116.3 days'."""
    if not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * SECONDS_PER_DAY:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / SECONDS_PER_DAY:.1f} days"


def describe_layout(layout: RunLayout) -> str:
    """'tp 8 x cp 2 x FSDP 4 x HSDP 64 (micro-batch 1, accumulation 3, AC M*-, reshard per_step, grads per_step
    fp32)' (FSDP's shard group counts the cp ranks)."""
    mesh = [f"{name} {size}" for name, size in (("tp", layout.tp), ("cp", layout.cp)) if size > 1]
    if layout.fsdp:
        mesh.append(f"FSDP {layout.shard}")
        if layout.replicate > 1:
            mesh.append(f"HSDP {layout.replicate}")
    else:
        mesh.append("no FSDP")
    policies = (f", reshard {layout.reshard}, grad_reduce {layout.grad_reduce} {layout.reduce_dtype}"
                if layout.fsdp else "")
    return (f"{' x '.join(mesh)} (micro-batch {layout.micro_batch}, accumulation {layout.accumulation}, "
            f"activation checkpointing {layout.checkpointed or 'none'}{policies})")


def short_layout(layout: RunLayout) -> str:
    """'tp 8, FSDP 32 x HSDP 8, micro 3 x 1, AC none, gather per micro-batch, reduce per step bf16' (tables)."""
    mesh = [f"{name} {size}" for name, size in (("tp", layout.tp), ("cp", layout.cp)) if size > 1] + (
        [f"FSDP {layout.shard}" + (f" x HSDP {layout.replicate}" if layout.replicate > 1 else "")] if layout.fsdp
        else ["no FSDP"])
    words = [", ".join(mesh), f"micro {layout.micro_batch} x {layout.accumulation}",
             f"AC {layout.checkpointed or 'none'}"]
    if layout.fsdp:
        words += [f"gather per {'step' if layout.reshard == 'per_step' else 'micro-batch'}",
                  f"reduce per {'step' if layout.grad_reduce == 'per_step' else 'micro-batch'} "
                  f"{'fp32' if layout.reduce_dtype == 'float32' else 'bf16'}"]
    return ", ".join(words)


@dataclass
class RunPlan:
    """One config on ``layout.gpus`` devices of ``layout.gpu``'s kind."""

    layout: RunLayout
    model: ModelConfig
    params: int
    memory: MemoryPlan
    time: StepTime
    flops_per_step: float
    """Model FLOPs of one optimizer step over all GPUs (models.flops, the MFU numerator)."""
    tokens_per_step: int
    """The batch actually run x the sequence length."""
    token_budget: float
    """Tokens the run trains on: train.steps x tokens per step unless given."""
    config: Optional[TrainConfig] = None
    """The config planned (for parallel=auto: the chosen one)."""
    overheads: Dict[str, float] = field(default_factory=dict)
    """Seconds of the run besides its steps: start-up, compilation, evaluation (trainer.planning.overheads)."""

    @property
    def peak_memory_gib(self) -> float:
        return self.memory.peak / GIB

    @property
    def usable_memory_gib(self) -> float:
        return usable_memory_gib(self.layout.gpu)

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.usable_memory_gib

    @property
    def step_time_s(self) -> float:
        return self.time.total

    @property
    def seconds_per_token(self) -> float:
        """Wall seconds of the whole cluster per token trained: parallel=auto's objective."""
        return self.step_time_s / self.tokens_per_step

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.layout.gpus

    @property
    def mfu(self) -> float:
        return self.flops_per_step / self.layout.gpus / self.step_time_s / self.layout.gpu.peak_flops["bf16"]

    @property
    def steps(self) -> int:
        """Optimizer steps to the token budget."""
        return steps_for_tokens(self.token_budget, self.tokens_per_step)

    @property
    def run_seconds(self) -> float:
        """Wall seconds of the run: its steps and the overheads."""
        return self.steps * self.step_time_s + sum(self.overheads.values())

    @property
    def days_to_token_budget(self) -> float:
        return self.run_seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.layout.gpus * self.run_seconds / 3600

    def as_dict(self, collectives: bool = True) -> dict:
        """The plan as plain values (python -m trainer.plan_run --json, run_info.json, the W&B config)."""
        layout = self.layout
        batch = layout.batch
        out = {
            "schema_version": SCHEMA_VERSION,
            "model": self.model.name,
            "precision": self.config.precision.name if self.config is not None else None,
            "gpu": layout.gpu.name,
            "gpus": layout.gpus,
            "params": self.params,
            "peak_memory_gib_per_gpu": self.peak_memory_gib,
            "usable_memory_gib_per_gpu": self.usable_memory_gib,
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "days_to_token_budget": self.days_to_token_budget,
            "run_seconds": self.run_seconds,
            "gpu_hours": self.gpu_hours,
            "steps": self.steps,
            "token_budget": self.token_budget,
            "tokens_per_step": self.tokens_per_step,
            "flops_per_step": self.flops_per_step,
            "memory_gib_per_gpu": self.memory.gib(),
            "step_time_parts_s": dict(self.time.parts),
            "communication_s": self.time.communication,
            "hidden_tensor_parallel_s": self.time.hidden_tensor_parallel,
            "overheads_s": dict(self.overheads),
            "layout": {
                "auto": bool(self.config.parallel.auto) if self.config is not None else False,
                "tp": layout.tp, "cp": layout.cp, "fsdp": layout.fsdp, "shard": layout.shard, "replicate": layout.replicate,
                "dp_ranks": layout.dp_ranks, "gpus_per_node": layout.gpus_per_node,
                "micro_batch": layout.micro_batch, "seq_len": layout.seq_len,
                "gradient_accumulation": layout.accumulation, "reshard": layout.reshard,
                "grad_reduce": layout.grad_reduce, "reduce_dtype": layout.reduce_dtype,
                "compute_bytes": layout.compute_bytes, "activation_checkpoint": layout.checkpointed or "none",
                "backend": layout.backend,
            },
            "batch": {
                "configured": batch.configured if batch else layout.global_batch, "global_batch": layout.global_batch,
                "adjusted": batch.adjusted if batch else False, "policy": batch.policy if batch else None,
                "micro_batch": layout.micro_batch, "accumulation": layout.accumulation,
            },
        }
        if collectives:
            out["collectives"] = [c.as_dict() for c in self.time.collectives]
        return out

    def memory_table(self) -> str:
        """Per-GPU memory by part, the peak and what the device offers."""
        rows = [f"  {name:<38} {gib:9.2f} GiB" for name, gib in self.memory.gib().items() if gib > 0]
        rows.append(f"  {'peak per ' + ('device' if self.layout.gpu.name == 'CPU' else 'GPU'):<38} "
                    f"{self.peak_memory_gib:9.2f} GiB (usable: {self.usable_memory_gib:.1f} of "
                    f"{self.layout.gpu.memory_gib:.1f} GiB)")
        return "\n".join(rows)

    def batch_line(self) -> str:
        batch = self.layout.batch
        if batch is None or not batch.adjusted:
            return f"Batch: {self.layout.global_batch} sequences a step (as configured)"
        return f"Batch: {batch.announcement()}"

    def communication_lines(self) -> List[str]:
        parts = self.time.parts
        hidden = self.time.hidden_tensor_parallel
        overlapped = (self.time.communication - parts.get("tensor-parallel communication", 0.0) - hidden
                      - parts.get("context-parallel communication", 0.0) - parts.get("scalar collectives", 0.0))
        tensor_parallel = (f"tensor-parallel collectives are not overlapped but for {format_seconds(hidden)} beside "
                           "their linears' GEMMs, scalar ones not at all" if hidden > 0 else
                           "tensor-parallel and scalar collectives are not overlapped")
        if self.layout.cp > 1:
            tensor_parallel += ", context-parallel ones not at all"
        lines = []
        if overlapped > 0:
            lines.append(f"  (FSDP/HSDP traffic {format_seconds(overlapped)}, each phase's calls behind its compute "
                         f"(the forwards' gathers, the backwards' reductions) but for "
                         f"{format_seconds(parts.get('communication (exposed)', 0.0))}; {tensor_parallel}; "
                         f"{len(self.time.collectives)} kinds of call, python -m trainer.plan_run --json lists them)")
        return lines

    def run_line(self) -> str:
        overhead = sum(self.overheads.values())
        return (f"Run: {self.token_budget:.3g} tokens in {self.steps:,} steps: {format_duration(self.run_seconds)} "
                f"(start-up, compilation and evaluation {format_duration(overhead)} of it)")

    def render(self) -> str:
        layout = self.layout
        precision = f" in {self.config.precision.name}" if self.config is not None else ""
        lines = [
            f"Plan: {self.model.name} ({format_count(self.params)} parameters){precision} on {layout.gpus} x "
            f"{layout.gpu.name}: {describe_layout(layout)}, {layout.seq_len}-token sequences, GEMMs {layout.backend}",
            self.batch_line(),
            "Memory per GPU:", self.memory_table(),
            f"Step time per GPU: {format_seconds(self.step_time_s)}",
            *(f"  {name:<38} {format_seconds(seconds):>12}" for name, seconds in self.time.parts.items()
              if seconds > 0),
            *self.communication_lines(),
            f"Throughput: {self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * self.mfu:.1f}% "
            f"(model FLOPs over the dense BF16 peak)",
            self.run_line(),
            f"Fits: {'yes' if self.fits else 'NO'}",
        ]
        return "\n".join(line for line in lines if line)


def format_seconds(seconds: float) -> str:
    """A step's parts: '48.40 s', '213.4 ms', '56 us'."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{1e3 * seconds:.1f} ms"
    return f"{1e6 * seconds:.0f} us"


def plan_run(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
             token_budget: Optional[float] = None, model: Optional[ModelConfig] = None,
             efficiency: Efficiency = H200_CALIBRATED) -> RunPlan:
    """Plan ``cfg``'s layout as written on ``gpus`` devices like ``gpu`` (``model`` replaces cfg.model, e.g.
    adopted from HF). parallel=auto's choice is trainer.planning.auto.choose_layout (its plan is this one of
    the chosen config)."""
    model = model or cfg.model
    layout = resolve_layout(cfg, gpu, gpus, gpus_per_node, model=model)
    tokens_per_step = layout.global_batch * cfg.data.seq_len
    budget = token_budget if token_budget is not None else float(cfg.train.steps * tokens_per_step)
    overheads = run_overheads(model, layout, steps_for_tokens(budget, tokens_per_step), cfg.train.eval_every,
                              cfg.train.eval_batches, efficiency)
    return RunPlan(
        layout=layout, model=model, params=count_parameters(model),
        memory=plan_memory(model, layout), time=plan_step_time(model, layout, efficiency),
        flops_per_step=flops_per_token(model, cfg.data.seq_len) * tokens_per_step,
        tokens_per_step=tokens_per_step, token_budget=budget, config=cfg, overheads=overheads,
    )


@dataclass(frozen=True)
class Change:
    """A change to the run that makes it fit, and its plan."""

    description: str
    overrides: List[str]
    gpus: int
    plan: RunPlan


def _with(cfg: TrainConfig, **sections) -> TrainConfig:
    """cfg with some fields of its sections replaced: _with(cfg, train={"micro_batch_size": 1})."""
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)
                                       for name, values in sections.items()})


def on_other_count(cfg: TrainConfig) -> TrainConfig:
    """cfg to plan on another GPU count: a mesh written for one world (parallel=auto's dp_shard, dp_replicate)
    becomes flat FSDP over the data-parallel ranks, and tensor parallelism is kept."""
    if cfg.parallel.dp_shard == -1 and cfg.parallel.dp_replicate == 1:
        return cfg
    return _with(cfg, parallel={"dp_shard": -1, "dp_replicate": 1})


def _runs_on(cfg: TrainConfig, gpus: int) -> bool:
    """Whether the batch policy accepts ``gpus`` GPUs for cfg (trainer.planning.batch)."""
    from trainer.planning.batch import resolve_batch

    try:
        resolve_batch(cfg, gpus)
    except ConfigError:
        return False
    return True


def smallest_changes(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                     model: Optional[ModelConfig] = None, max_gpus: int = 4096) -> List[Change]:
    """One-knob changes that make the run fit on this kind of device, cheapest step first: activation
    checkpointing, a smaller micro-batch, more devices (counts the batch policy accepts). More CPU processes
    share one host's RAM, so a CPU gets no device-count change."""
    candidates = []
    if cfg.parallel.activation_checkpoint != "full":
        candidates.append(("recompute every block's activations", ["parallel.activation_checkpoint=full"],
                           _with(cfg, parallel={"activation_checkpoint": "full"}), gpus))
    micro = cfg.train.micro_batch_size
    while micro > 1:
        micro //= 2
        smaller = _with(cfg, train={"micro_batch_size": micro})
        if cfg.train.global_batch_size % micro == 0 and _runs_on(smaller, gpus):
            candidates.append((f"micro-batch {micro}", [f"train.micro_batch_size={micro}"], smaller, gpus))
            break
    if gpu.name != "CPU":
        count, other = gpus * 2, on_other_count(cfg)
        while count <= max_gpus:
            if _runs_on(other, count):
                candidates.append((f"{count} GPUs", [], other, count))
                if _fitting_plan(other, gpu, count, gpus_per_node, model) is not None:
                    break
            count *= 2
    changes = []
    for description, overrides, changed, count in candidates:
        plan = _fitting_plan(changed, gpu, count, gpus_per_node, model)
        if plan is not None:
            changes.append(Change(description, overrides, count, plan))
    return sorted(changes, key=lambda change: change.plan.step_time_s * change.gpus)


def smallest_fitting_gpus(cfg: TrainConfig, gpu: GpuSpec, gpus_per_node: Optional[int] = None,
                          model: Optional[ModelConfig] = None, max_gpus: int = 4096) -> Optional[RunPlan]:
    """The plan on the fewest GPUs of this kind (a power of two the batch policy accepts) that fits."""
    count, cfg = 1, on_other_count(cfg)
    while count <= max_gpus:
        if _runs_on(cfg, count):
            plan = _fitting_plan(cfg, gpu, count, gpus_per_node, model)
            if plan is not None:
                return plan
        count *= 2
    return None


def _fitting_plan(cfg, gpu, gpus, gpus_per_node, model) -> Optional[RunPlan]:
    """plan_run's plan if the layout is valid there and fits, else None."""
    try:
        plan = plan_run(cfg, gpu, gpus, gpus_per_node, model=model)
    except ConfigError:  # e.g. parallel.tp larger than a node of this count
        return None
    return plan if plan.fits else None
