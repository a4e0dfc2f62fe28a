"""The run plan: parameters, memory, step time, throughput and duration of a config on N devices of a kind.

    plan = plan_run(cfg, device_spec("B200"), gpus=64)      # no model is built on a device
    plan.fits, plan.peak_memory_gib, plan.step_time_s, plan.as_dict(), plan.render()
    smallest_changes(cfg, spec, gpus)                        # what would make a run that does not fit, fit

Memory: trainer.planning.memory; time: trainer.planning.step_time; the layout both read:
trainer.planning.layout. MFU is the model FLOPs of models.flops (Megatron's hybrid formula) over the
dense BF16 peak, whatever format the GEMMs run in, as the trainer's metrics compute it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from models.config import ModelConfig
from models.flops import count_parameters, flops_per_token
from trainer.config import TrainConfig
from trainer.hardware import GpuSpec
from trainer.planning.layout import RunLayout, resolve_layout
from trainer.planning.memory import GIB, MemoryPlan, plan_memory
from trainer.planning.step_time import H200_CALIBRATED, Efficiency, StepTime, plan_step_time

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
    token_budget: float
    """Tokens the run trains on: train.steps x tokens per step unless given."""

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
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.layout.gpus

    @property
    def mfu(self) -> float:
        return self.flops_per_step / self.layout.gpus / self.step_time_s / self.layout.gpu.peak_flops["bf16"]

    @property
    def days_to_token_budget(self) -> float:
        return self.token_budget / self.tokens_per_step * self.step_time_s / SECONDS_PER_DAY

    def as_dict(self) -> dict:
        """The plan as plain values (scripts/plan_run.py --json, run_info.json, the W&B config)."""
        layout = self.layout
        return {
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
            "token_budget": self.token_budget,
            "tokens_per_step": self.tokens_per_step,
            "flops_per_step": self.flops_per_step,
            "memory_gib_per_gpu": self.memory.gib(),
            "step_time_parts_s": dict(self.time.parts),
            "communication_s": self.time.communication,
            "layout": {
                "fsdp": layout.fsdp, "shard": layout.shard, "replicate": layout.replicate,
                "gpus_per_node": layout.gpus_per_node, "micro_batch": layout.micro_batch,
                "seq_len": layout.seq_len, "gradient_accumulation": layout.accumulation,
                "compute_bytes": layout.compute_bytes, "activation_checkpoint": layout.checkpointed or "none",
                "backend": layout.backend,
            },
        }

    def memory_table(self) -> str:
        """Per-GPU memory by part, the peak and what the device offers."""
        rows = [f"  {name:<38} {gib:9.2f} GiB" for name, gib in self.memory.gib().items() if gib > 0]
        rows.append(f"  {'peak per ' + ('device' if self.layout.gpu.name == 'CPU' else 'GPU'):<38} "
                    f"{self.peak_memory_gib:9.2f} GiB (usable: {self.usable_memory_gib:.1f} of "
                    f"{self.layout.gpu.memory_gib:.1f} GiB)")
        return "\n".join(rows)

    def render(self) -> str:
        layout = self.layout
        where = (f"{layout.gpus} x {layout.gpu.name}" + (f" (FSDP over {layout.shard}" if layout.fsdp else " (no FSDP")
                 + (f", {layout.replicate} HSDP replicas)" if layout.replicate > 1 else ")"))
        lines = [
            f"Plan: {self.model.name} ({self.params / 1e9:.2f}B parameters) on {where}, micro-batch "
            f"{layout.micro_batch} x {layout.seq_len} tokens, gradient accumulation {layout.accumulation}, "
            f"activation checkpointing {layout.checkpointed or 'none'}, GEMMs {layout.backend}",
            "Memory per GPU:", self.memory_table(),
            f"Step time per GPU: {1e3 * self.step_time_s:.1f} ms",
            *(f"  {name:<38} {1e3 * seconds:9.1f} ms" for name, seconds in self.time.parts.items() if seconds > 0),
            f"  (FSDP/HSDP traffic {1e3 * self.time.communication:.1f} ms, overlapped with compute but for "
            f"{1e3 * self.time.exposed_communication:.1f} ms)" if self.time.communication else "",
            f"Throughput: {self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * self.mfu:.1f}% "
            f"(model FLOPs over the dense BF16 peak)",
            f"Token budget {self.token_budget:.3g}: {self.days_to_token_budget:.2f} days",
            f"Fits: {'yes' if self.fits else 'NO'}",
        ]
        return "\n".join(line for line in lines if line)


def plan_run(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
             token_budget: Optional[float] = None, model: Optional[ModelConfig] = None,
             efficiency: Efficiency = H200_CALIBRATED) -> RunPlan:
    """Plan ``cfg`` on ``gpus`` devices like ``gpu`` (``model`` replaces cfg.model, e.g. adopted from HF)."""
    model = model or cfg.model
    layout = resolve_layout(cfg, gpu, gpus, gpus_per_node, model=model)
    tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
    return RunPlan(
        layout=layout, model=model, params=count_parameters(model),
        memory=plan_memory(model, layout), time=plan_step_time(model, layout, efficiency),
        flops_per_step=flops_per_token(model, cfg.data.seq_len) * tokens_per_step,
        tokens_per_step=tokens_per_step,
        token_budget=token_budget if token_budget is not None else float(cfg.train.steps * tokens_per_step),
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


def smallest_changes(cfg: TrainConfig, gpu: GpuSpec, gpus: int, gpus_per_node: Optional[int] = None,
                     model: Optional[ModelConfig] = None, max_gpus: int = 4096) -> List[Change]:
    """One-knob changes that make the run fit on this kind of device, cheapest step first: activation
    checkpointing, a smaller micro-batch, more devices (a multiple of the count that divides the global
    batch). More CPU processes share one host's RAM, so a CPU gets no device-count change."""
    candidates = []
    if cfg.parallel.activation_checkpoint != "full":
        candidates.append(("recompute every block's activations", ["parallel.activation_checkpoint=full"],
                           _with(cfg, parallel={"activation_checkpoint": "full"}), gpus))
    micro = cfg.train.micro_batch_size
    while micro > 1:
        micro //= 2
        if cfg.train.global_batch_size % (micro * gpus) == 0:
            candidates.append((f"micro-batch {micro}", [f"train.micro_batch_size={micro}"],
                               _with(cfg, train={"micro_batch_size": micro}), gpus))
            break
    if gpu.name != "CPU":
        count = gpus * 2
        while count <= max_gpus:
            if cfg.train.global_batch_size % (cfg.train.micro_batch_size * count) == 0:
                candidates.append((f"{count} GPUs", [], cfg, count))
                if plan_run(cfg, gpu, count, gpus_per_node, model=model).fits:
                    break
            count *= 2
    changes = []
    for description, overrides, changed, count in candidates:
        plan = plan_run(changed, gpu, count, gpus_per_node, model=model)
        if plan.fits:
            changes.append(Change(description, overrides, count, plan))
    return sorted(changes, key=lambda change: change.plan.step_time_s * change.gpus)


def smallest_fitting_gpus(cfg: TrainConfig, gpu: GpuSpec, gpus_per_node: Optional[int] = None,
                          model: Optional[ModelConfig] = None, max_gpus: int = 4096) -> Optional[RunPlan]:
    """The plan on the fewest GPUs of this kind (a power of two dividing the global batch) that fits."""
    count = 1
    while count <= max_gpus:
        if cfg.train.global_batch_size % (cfg.train.micro_batch_size * count) == 0:
            plan = plan_run(cfg, gpu, count, gpus_per_node, model=model)
            if plan.fits:
                return plan
        count *= 2
    return None
