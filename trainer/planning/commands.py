"""What `python -m trainer.plan_run` prints besides the plan: runnable command lines, the cost, the device planned.

    device_for_plan("CPU", gpus=2)          # this host's RAM shared by 2 processes, as the preflight sees it
    plan_command(overrides, "B200", 64)     # 'python -m trainer.plan_run ... --gpu B200 --gpus 64'
    launch_command(overrides, 64, 8)        # 'sbatch --nodes=8 "$(python -m trainer.slurm)" ...'
    cost_line(plan, price)                  # GPU-hours, and the cost at a price per GPU-hour
"""

from __future__ import annotations

import math
import shlex
from typing import Optional, Sequence

from trainer.hardware import GpuSpec, cpu_spec, device_spec, host_memory_gib
from trainer.planning.plan import RunPlan


def device_for_plan(name: str, gpus: int, gpus_per_node: Optional[int] = None) -> GpuSpec:
    """The device to plan on: a GPU's spec, or this host as the preflight plans it for ``gpus`` processes
    (its RAM shared by the processes of one host: gpus_per_node, else all of them)."""
    spec = device_spec(name)
    if spec.name != "CPU":
        return spec
    return cpu_spec(memory_gib=host_memory_gib() / max(1, min(gpus, gpus_per_node or gpus)))


def with_override(overrides: Sequence[str], key: str, value: str) -> list:
    """``overrides`` with ``key=value`` in place of any override of the same key (a group or a field)."""
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    return [*kept, f"{key}={value}"]


def with_overrides(overrides: Sequence[str], changes: Sequence[str]) -> list:
    """``overrides`` with each ``key=value`` of ``changes`` in place of the same key's."""
    out = list(overrides)
    for change in changes:
        key, value = change.split("=", 1)
        out = with_override(out, key.lstrip("+"), value)
    return out


def _quoted(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def plan_command(overrides: Sequence[str], gpu: str, gpus: int, gpus_per_node: Optional[int] = None,
                 extra: Sequence[str] = ()) -> str:
    """The `python -m trainer.plan_run` line that plans these overrides on ``gpus`` GPUs of kind ``gpu``."""
    words = ["python", "-m", "trainer.plan_run", *overrides, "--gpu", gpu, "--gpus", str(gpus)]
    if gpus_per_node:
        words += ["--gpus-per-node", str(gpus_per_node)]
    return _quoted([*words, *extra])


NVL72_TRAY_GPUS = 4
"""GPUs of one host in an NVL72 rack (a compute tray: trainer/hardware.py), where the NVLink domain is 72."""


def launch_command(overrides: Sequence[str], gpus: int, gpus_per_node: int) -> str:
    """The line that starts this run: torchrun on one host, the installed trainer/slurm_train.sh on several (its
    path printed by `python -m trainer.slurm`, so the line works from a wheel; GPUS_PER_NODE when not 8).
    A host is the NVLink domain up to 8 GPUs (an HGX board), else an NVL72 compute tray."""
    per_node = min(gpus, gpus_per_node if gpus_per_node <= 8 else NVL72_TRAY_GPUS)
    nodes = math.ceil(gpus / per_node)
    if nodes == 1:
        return _quoted(["torchrun", "--nproc-per-node", str(per_node), "-m", "trainer", *overrides])
    prefix = f"GPUS_PER_NODE={per_node} " if per_node != 8 else ""
    return f'{prefix}sbatch --nodes={nodes} "$(python -m trainer.slurm)" {_quoted(overrides)}'.rstrip()


def cost_line(plan: RunPlan, price_per_gpu_hour: Optional[float] = None) -> str:
    """'Cost: 178,000 GPU-hours' (and at a price: ', $534,000 at $3.00 per GPU-hour')."""
    hours = plan.gpu_hours
    shown = f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"
    line = f"Cost: {shown} GPU-hours ({plan.layout.gpus} GPU{'s' if plan.layout.gpus > 1 else ''})"
    if price_per_gpu_hour is not None:
        line += f", {hours * price_per_gpu_hour:,.2f} at {price_per_gpu_hour:g} per GPU-hour"
    return line
