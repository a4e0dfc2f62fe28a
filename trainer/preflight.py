"""Plan every run for the devices it sees before anything is built, and stop one that cannot fit.

`preflight(cfg)` runs in `trainer.loop.train` after the config's fields are checked and before the
process group, the data or the model: it plans the run (trainer.planning) for this launch's world
size on this process's device, a GPU (its own memory, its datasheet rates when the name is known)
or the CPU (the host's RAM shared by the processes of this node). A run whose planned peak exceeds
the usable memory stops with `PreflightError`: the plan's memory table and the smallest changes that
would fit (activation checkpointing, micro-batch, more GPUs; on a CPU, the fewest GPUs that would).
`train.preflight=false` skips it; `train.preflight_memory_gib` plans for a stated memory instead of
the device's. The plan goes into run_info.json and the W&B config, and `PlanCheck` logs a
`plan_check` event comparing the measured step time and peak memory with it.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
from typing import Optional

import torch

from trainer.callbacks import Callback, StepContext
from trainer.config import TrainConfig
from trainer.hardware import GPUS, GpuSpec, cpu_spec, detect_gpu, host_memory_gib
from trainer.planning import RunPlan, plan_run, smallest_changes, smallest_fitting_gpus
from trainer.planning.plan import format_count
from trainer.validate import ConfigError

SUGGESTED_GPUS = ("H200", "B200", "GB300")
"""GPU kinds a run refused on a CPU is planned on, for the message."""


class PreflightError(RuntimeError):
    """The run does not fit the devices it was started on; the message holds the plan's memory table."""


def devices_seen(cfg: TrainConfig) -> tuple[GpuSpec, int, int]:
    """(this process's device as a spec, world size, processes on this node) from the launch environment."""
    from trainer.distributed import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    try:
        device = resolve_device(cfg.parallel.device)
    except RuntimeError as error:  # parallel.device=cuda on a machine without CUDA: the user's to change
        raise ConfigError(str(error)) from error
    stated = cfg.train.preflight_memory_gib
    if device.type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        properties = torch.cuda.get_device_properties(local_rank)
        known = detect_gpu(torch.device("cuda", local_rank))
        # An unknown GPU is planned with the H100's rates: its memory is what the check needs.
        spec = dataclasses.replace(known or GPUS["H100"], name=known.name if known else properties.name,
                                   memory_gib=properties.total_memory / 2**30)
    else:
        spec = cpu_spec(memory_gib=host_memory_gib() / local_world)
    if stated is not None:
        spec = dataclasses.replace(spec, memory_gib=stated)
    return spec, world, local_world


def preflight(cfg: TrainConfig) -> Optional[RunPlan]:
    """The run's plan on the devices seen (None with train.preflight=false); PreflightError if it cannot fit."""
    if not cfg.train.preflight:
        return None
    model = cfg.model
    if cfg.checkpoint.init_from_hf:  # the directory's config.json sets the architecture
        from trainer.hf.load import adopt_hf_architecture

        model, _ = adopt_hf_architecture(cfg.model, cfg.checkpoint.init_from_hf)
    spec, world, local_world = devices_seen(cfg)
    plan = plan_run(cfg, spec, world, gpus_per_node=local_world, model=model)  # parallel=auto: chosen before
    if not plan.fits:
        raise PreflightError(refusal_message(cfg, plan, model))
    return plan


def refusal_message(cfg: TrainConfig, plan: RunPlan, model) -> str:
    """What a refused run prints: what it needs, the memory table, and what would fit."""
    layout = plan.layout
    device = ("this host's RAM" + (f" shared by {layout.gpus_per_node} processes" if layout.gpus_per_node > 1 else "")
              if layout.gpu.name == "CPU" else f"each {layout.gpu.name}")
    lines = [
        f"the run does not fit: {model.name} ({format_count(plan.params)} parameters) needs "
        f"{plan.peak_memory_gib:.1f} GiB per device at its peak on {layout.gpus} "
        f"{'process' if layout.gpus == 1 else 'processes'}; {device} offers {plan.usable_memory_gib:.1f} GiB "
        f"usable of {layout.gpu.memory_gib:.1f} GiB.",
        "Planned memory per device:", plan.memory_table(),
    ]
    fixes = []
    for change in smallest_changes(cfg, layout.gpu, layout.gpus, layout.gpus_per_node, model=model)[:3]:
        how = " ".join(change.overrides) or f"torchrun --nproc-per-node {min(change.gpus, 8)}" + (
            f" --nnodes {change.gpus // 8}" if change.gpus > 8 else "")
        fixes.append(f"  {change.description}: {change.plan.peak_memory_gib:.1f} GiB per device ({how})")
    if layout.gpu.name == "CPU":
        for name in SUGGESTED_GPUS:
            fitting = smallest_fitting_gpus(cfg, GPUS[name], model=model)
            if fitting is not None:
                fixes.append(f"  {fitting.layout.gpus} x {name}: {fitting.peak_memory_gib:.1f} GiB of "
                             f"{fitting.usable_memory_gib:.0f} usable per GPU, {fitting.step_time_s:.1f} s per step "
                             f"(python -m trainer.plan_run ... --gpu {name} --gpus {fitting.layout.gpus})")
    lines.append("What would fit:" if fixes else "No single change of activation checkpointing, micro-batch or "
                 "device count makes it fit (python -m trainer.plan_run plans other layouts).")
    lines += fixes
    lines.append("train.preflight=false starts it anyway; train.preflight_memory_gib=N plans for N GiB per device.")
    return "\n".join(lines)


def measured_peak_memory_gib(device: torch.device) -> float:
    """The step's peak as the run measures it: the CUDA allocator's, or this process's largest RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


class PlanCheck(Callback):
    """Logs one `plan_check` event: measured against planned step time and peak memory.

    At the second metrics line (the first one's window holds compilation and warm-up), or the first
    line of a run too short for two.
    """

    def __init__(self, plan: Optional[RunPlan]):
        self.plan = plan
        self.lines_seen = 0
        self.done = plan is None

    def on_step_end(self, ctx: StepContext, metrics: dict) -> None:
        if self.done or not metrics or metrics.get("step_time_s") is None:
            return
        self.lines_seen += 1
        last_line = ctx.state.step + ctx.cfg.logging.log_every > ctx.cfg.train.steps
        if self.lines_seen < 2 and not last_line:
            return
        self.done = True
        measured_time, measured_memory = metrics["step_time_s"], measured_peak_memory_gib(ctx.env.device)
        planned_time, planned_memory = self.plan.step_time_s, self.plan.peak_memory_gib
        ctx.logger.event(ctx.state.step, "plan_check", planned_step_time_s=planned_time,
                         measured_step_time_s=measured_time, step_time_ratio=measured_time / planned_time,
                         planned_peak_memory_gib=planned_memory, measured_peak_memory_gib=measured_memory,
                         memory_ratio=measured_memory / planned_memory, device=self.plan.layout.gpu.name)
