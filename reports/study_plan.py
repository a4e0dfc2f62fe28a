"""What a study's runs will cost on one GPU, before any runs: the planner's step time and memory per run.

    python scripts/run_study.py --study results/study/study.yaml --plan H100

For each run: the trainer's config composed as `python -m trainer` would compose it, then
trainer.planning.plan_run on one GPU of that kind: the step time, the run's time alone on the GPU
(steps x step time) and the planned peak of allocated memory. Then how many runs fit side by side:

    per process = SIDE_BY_SIDE_MEMORY_FACTOR x planned peak + CUDA_RESERVED_GIB
    side by side = floor(GPU memory / per process), largest run of the selection

The factor is measured: study-size processes (planned peak 10.2 GiB) held 12.3-16.6 GiB each on an
H100 (CUDA graphs' private pools, the evaluation's buffers and the caching allocator on top of the
peak of live tensors). The sum of the alone times is the GPU time when the card is saturated; runs
this small leave it mostly idle, so packing them side by side beats the sum (docs/study.md has the
measured aggregate), and a larger model gains less from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from reports.study_definition import StudyRun

SIDE_BY_SIDE_MEMORY_FACTOR = 1.5
"""GPU memory a study process holds over the planner's peak of allocated tensors (measured, see above)."""


@dataclass
class PlannedRun:
    run: StudyRun
    params: int
    steps: int
    tokens: float
    step_time_s: float
    peak_gib: float

    @property
    def alone_s(self) -> float:
        """The run's time alone on the GPU: steps x planned step time (evaluation and compilation left out)."""
        return self.steps * self.step_time_s


def plan_study_runs(runs: Sequence[StudyRun], gpu_name: str) -> tuple[list[PlannedRun], int]:
    """(a plan per run, how many of the largest fit side by side on one GPU of kind ``gpu_name``)."""
    from trainer.config import compose
    from trainer.hardware import device_spec
    from trainer.planning import plan_run
    from trainer.planning.plan import CUDA_RESERVED_GIB

    gpu = device_spec(gpu_name)
    planned = []
    for run in runs:
        cfg = compose(run.trainer_arguments())
        plan = plan_run(cfg, gpu, 1)
        planned.append(PlannedRun(run, plan.params, cfg.train.steps, plan.token_budget, plan.step_time_s,
                                  plan.peak_memory_gib))
    if not planned:
        return [], 0
    per_process = SIDE_BY_SIDE_MEMORY_FACTOR * max(p.peak_gib for p in planned) + CUDA_RESERVED_GIB
    return planned, max(0, math.floor(gpu.memory_gib / per_process))


def render_plan(planned: Sequence[PlannedRun], side_by_side: int, gpu_name: str) -> str:
    lines = [f"{'run':32s} {'params':>8s} {'steps':>6s} {'tokens':>8s} {'step ms':>8s} {'alone min':>9s} {'peak GiB':>8s}"]
    for p in planned:
        lines.append(f"{p.run.id:32s} {p.params / 1e6:7.2f}M {p.steps:6d} {p.tokens / 1e6:7.1f}M "
                     f"{1e3 * p.step_time_s:8.1f} {p.alone_s / 60:9.1f} {p.peak_gib:8.1f}")
    total = sum(p.alone_s for p in planned)
    lines.append(f"{len(planned)} run(s) on one {gpu_name}: {total / 3600:.2f} GPU-hours alone, one after another; "
                 f"{side_by_side} fit side by side by memory (--parallel)")
    return "\n".join(lines)
