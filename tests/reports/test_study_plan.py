"""run_study.py --plan: the planner's time and memory per study run, how many fit side by side, and each run's
wall time packed in calls; every run of the study file plans to finish within 20 minutes of one H100."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from study.definition import load_study
from study.plan import (
    FORWARD_SHARE,
    LAUNCH_S,
    PREPARE_S,
    SIDE_BY_SIDE_MEMORY_FACTOR,
    packed_wall,
    plan_study_runs,
    render_plan,
)
from trainer.config import compose
from trainer.hardware import device_spec
from trainer.planning import plan_run
from trainer.planning.plan import CUDA_RESERVED_GIB

REPOSITORY = Path(__file__).resolve().parents[2]
STUDY = REPOSITORY / "results" / "study" / "study.yaml"


def test_each_run_is_planned_as_the_trainer_composes_it():
    study = load_study(STUDY)
    runs = study.select(["9m/bf16/seed0", "32m/nvfp4/seed1"])
    planned, side_by_side = plan_study_runs(runs, "H100")
    small, large = planned
    for entry in planned:  # the same numbers as plan_run on the run's own composed config
        cfg = compose(entry.run.trainer_arguments())
        plan = plan_run(cfg, device_spec("H100"), 1)
        assert entry.step_time_s == plan.step_time_s and entry.peak_gib == plan.peak_memory_gib
        assert entry.alone_s == pytest.approx(entry.steps * plan.step_time_s)
        evaluations = cfg.train.steps // cfg.train.eval_every  # 20: every 5% of the steps
        assert evaluations == 20 and entry.eval_s == pytest.approx(
            evaluations * cfg.train.eval_batches * plan.step_time_s * FORWARD_SHARE)
    assert (small.steps, large.steps) == (1400, 4840) and large.params > 3 * small.params
    assert large.alone_s > 5 * small.alone_s and large.peak_gib > small.peak_gib
    per_process = SIDE_BY_SIDE_MEMORY_FACTOR * large.peak_gib + CUDA_RESERVED_GIB  # the largest run decides
    assert side_by_side == math.floor(device_spec("H100").memory_gib / per_process) >= 1
    nine_only, nine_side_by_side = plan_study_runs(runs[:1], "H200")
    assert nine_side_by_side > side_by_side  # a larger card and smaller runs: more side by side
    table = render_plan(planned, side_by_side, "H100", parallel=1, deadline_s=540)
    assert "9m/bf16/seed0" in table and "32m/nvfp4/seed1" in table and f"{side_by_side} fit side by side" in table
    assert "packed 1 side by side in calls stopped at 540 s" in table


def test_a_packed_run_pays_start_up_per_call_and_shares_the_gpu():
    """The wall-time arithmetic of study.plan, by hand: 100 s of work alone, three side by side, calls of 400 s."""
    one = packed_wall(100.0, 1, None, launch_s=30, prepare_s=10)
    assert (one.calls, one.wall_s) == (1, 10 + 30 + 100)
    shared = packed_wall(100.0, 3, 400.0, launch_s=30, prepare_s=10)  # 300 s of shared time
    assert shared.calls == 1 and shared.wall_s == 10 + 30 + 300  # 360 s of the first call's 400 - 10 - 30
    split = packed_wall(100.0, 4, 300.0, launch_s=50, prepare_s=40)  # 400 s: 210 in call 1, 190 in call 2
    assert split.calls == 2 and split.wall_s == pytest.approx(40 + 50 + 210 + 50 + 190)
    with pytest.raises(ValueError, match="no time to train"):
        packed_wall(100.0, 1, LAUNCH_S + PREPARE_S)


SIDE_BY_SIDE_ON_AN_H100 = {"3m": 6, "9m": 2, "19m": 1, "32m": 1}
"""How docs/study.md packs each size on an H100 (`--parallel`), in calls stopped at 540 s (`--deadline`)."""


def test_every_run_of_the_study_plans_to_finish_within_20_minutes_of_one_h100():
    """docs/study.md's per-size plan: each run, packed as the doc packs its size, in calls of 540 s of a 10-minute
    device call, plans to end within 20 minutes of its first call's start (corpus preparation, start-up and
    compilation at every call, evaluation included)."""
    study = load_study(STUDY)
    assert set(SIDE_BY_SIDE_ON_AN_H100) == set(study.sizes)
    for size, parallel in SIDE_BY_SIDE_ON_AN_H100.items():
        runs = [run for run in study.runs() if run.size == size and run.seed == study.seeds[0]]
        planned, fit = plan_study_runs(runs, "H100")
        assert parallel <= fit, size
        for entry in planned:
            wall = packed_wall(entry.work_s, parallel, 540)
            assert wall.wall_s <= 20 * 60, (entry.run.id, wall)


def test_the_command_plans_only_what_is_not_done_and_names_an_unknown_gpu():
    def plan(*arguments):
        return subprocess.run([sys.executable, str(REPOSITORY / "scripts" / "run_study.py"), "--study", str(STUDY),
                               *arguments], cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(REPOSITORY), "PATH": "/usr/bin:/bin"})

    done = plan("--only", "9m/bf16/*", "19m/bf16/seed0", "--plan", "H200", "--parallel", "1", "--deadline", "540")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[1:-1]]
    assert rows == ["19m/bf16/seed0"] and "1 run(s) on one H200" in done.stdout  # 9m/bf16: completed
    calls, wall = done.stdout.splitlines()[1].split()[-2:]
    assert int(calls) >= 1 and 0 < float(wall) <= 20
    unknown = plan("--only", "19m/bf16/seed0", "--plan", "H900")
    assert unknown.returncode != 0 and "unknown GPU 'H900'" in unknown.stderr
