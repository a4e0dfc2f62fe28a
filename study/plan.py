"""What a study's runs will cost on one GPU, before any runs: the planner's step time and memory per run,
and each run's wall time as the runner packs it, in calls of a deadline.

    python scripts/run_study.py --study results/study/study.yaml --plan H100 --parallel 1 --deadline 540

For each run: the trainer's config composed as `python -m trainer` would compose it, then
trainer.planning.plan_run on one GPU of that kind: the step time, the run's time alone on the GPU
(steps x step time) and the planned peak of allocated memory. Then how many runs fit side by side:

    per process = SIDE_BY_SIDE_MEMORY_FACTOR x planned peak + CUDA_RESERVED_GIB
    side by side = floor(GPU memory / per process), largest run of the selection

The factor is measured: study-size processes (planned peak 10.2 GiB) held 12.3-16.6 GiB each on an
H100 (CUDA graphs' private pools, the evaluation's buffers and the caching allocator on top of the
peak of live tensors).

The wall time of a run, packed k side by side (k: --parallel, at most what fits) in calls that the
runner stops at --deadline seconds:

    work     = steps x step time + evaluations x eval_batches x step time / 3   (a forward is ~1/3 of a step)
    per call = deadline - LAUNCH_S - (PREPARE_S in the first call), of which the run gets 1/k
    wall     = PREPARE_S + per launch (LAUNCH_S + its share), calls until k x work is done

Measured at the study size (docs/study.md): on an H100 runs side by side share the GPU's throughput
(three 9m NVFP4 runs trained ~1.0M tokens/s together, what one trains alone), so a run's share is 1/k;
an evaluation of 8 batches cost ~2.4 step times (2.7 modelled); start-up, compilation and the CUDA
graph's recording took 117-186 s per launch (LAUNCH_S); the corpus's preparation 58-86 s once per
machine (PREPARE_S). Gaps between calls (the machine's own) are not in the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from study.definition import StudyRun

SIDE_BY_SIDE_MEMORY_FACTOR = 1.5
"""GPU memory a study process holds over the planner's peak of allocated tensors (measured, see above)."""
LAUNCH_S = 180.0
"""Seconds from a launch to its first step after compilation and the CUDA graph's recording (measured 117-186 s)."""
PREPARE_S = 90.0
"""Seconds the runner spends preparing the corpus at the start of a machine's first call (measured 58-86 s)."""
FORWARD_SHARE = 1 / 3
"""An evaluation batch's forward against a training step's forward and backward."""


@dataclass
class PlannedRun:
    run: StudyRun
    params: int
    steps: int
    tokens: float
    step_time_s: float
    peak_gib: float
    eval_s: float = 0.0
    """The run's evaluations: evaluations x eval_batches x step time x FORWARD_SHARE."""

    @property
    def alone_s(self) -> float:
        """The run's time alone on the GPU: steps x planned step time (evaluation and compilation left out)."""
        return self.steps * self.step_time_s

    @property
    def work_s(self) -> float:
        """Training and evaluation alone on the GPU, no start-up."""
        return self.alone_s + self.eval_s


@dataclass(frozen=True)
class PackedWall:
    """A run's planned wall time as packed: seconds from its first call's start to its end, and its calls."""

    wall_s: float
    calls: int


def packed_wall(work_s: float, side_by_side: int, deadline_s: Optional[float], launch_s: float = LAUNCH_S,
                prepare_s: float = PREPARE_S) -> PackedWall:
    """The wall time of a run of ``work_s`` alone, sharing the GPU with ``side_by_side`` - 1 others for all of
    it, in calls stopped at ``deadline_s`` (None: one call, no deadline); every launch pays ``launch_s``,
    the first call ``prepare_s`` before it (see the module docstring)."""
    if side_by_side < 1:
        raise ValueError(f"side_by_side must be >= 1, got {side_by_side}")
    remaining, wall, calls = work_s * side_by_side, prepare_s, 0
    while remaining > 0 or calls == 0:
        calls += 1
        budget = math.inf if deadline_s is None else deadline_s - launch_s - (prepare_s if calls == 1 else 0.0)
        if budget <= 0:
            raise ValueError(f"a deadline of {deadline_s:.0f} s leaves no time to train after start-up "
                             f"({launch_s:.0f} s) and the corpus's preparation ({prepare_s:.0f} s)")
        used = min(remaining, budget)
        wall, remaining = wall + launch_s + used, remaining - used
    return PackedWall(wall, calls)


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
        evaluations = cfg.train.steps // cfg.train.eval_every if cfg.train.eval_every else 0
        planned.append(PlannedRun(run, plan.params, cfg.train.steps, plan.token_budget, plan.step_time_s,
                                  plan.peak_memory_gib,
                                  eval_s=evaluations * cfg.train.eval_batches * plan.step_time_s * FORWARD_SHARE))
    if not planned:
        return [], 0
    per_process = SIDE_BY_SIDE_MEMORY_FACTOR * max(p.peak_gib for p in planned) + CUDA_RESERVED_GIB
    return planned, max(0, math.floor(gpu.memory_gib / per_process))


def render_plan(planned: Sequence[PlannedRun], side_by_side: int, gpu_name: str, parallel: Optional[int] = None,
                deadline_s: Optional[float] = None) -> str:
    """The plan's table: per run its alone time and, packed min(parallel, side_by_side, runs) side by side in
    calls of ``deadline_s``, its calls and wall time; then the totals."""
    packed = max(1, min(parallel or side_by_side, side_by_side, len(planned)) if planned else 1)
    lines = [f"{'run':32s} {'params':>8s} {'steps':>6s} {'tokens':>8s} {'step ms':>8s} {'alone min':>9s} "
             f"{'peak GiB':>8s} {'calls':>5s} {'wall min':>8s}"]
    walls = []
    for p in planned:
        wall = packed_wall(p.work_s, packed, deadline_s)
        walls.append(wall)
        lines.append(f"{p.run.id:32s} {p.params / 1e6:7.2f}M {p.steps:6d} {p.tokens / 1e6:7.1f}M "
                     f"{1e3 * p.step_time_s:8.1f} {p.alone_s / 60:9.1f} {p.peak_gib:8.1f} {wall.calls:5d} "
                     f"{wall.wall_s / 60:8.1f}")
    total = sum(p.alone_s for p in planned)
    calls = f"calls stopped at {deadline_s:.0f} s" if deadline_s is not None else "one call"
    longest = max((w.wall_s for w in walls), default=0.0)
    lines.append(f"{len(planned)} run(s) on one {gpu_name}: {total / 3600:.2f} GPU-hours alone, one after another; "
                 f"{side_by_side} fit side by side by memory (--parallel); packed {packed} side by side in {calls}, "
                 f"the longest takes {longest / 60:.1f} min (corpus preparation, start-up, compilation and "
                 f"evaluation included)")
    return "\n".join(lines)
