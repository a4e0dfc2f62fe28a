"""run_study.py --plan: the planner's time and memory per study run, and how many fit side by side."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from reports.study_definition import load_study
from reports.study_plan import SIDE_BY_SIDE_MEMORY_FACTOR, plan_study_runs, render_plan
from trainer.config import compose
from trainer.hardware import device_spec
from trainer.planning import plan_run
from trainer.planning.plan import CUDA_RESERVED_GIB

REPOSITORY = Path(__file__).resolve().parents[2]
STUDY = REPOSITORY / "results" / "study" / "study.yaml"


def test_each_run_is_planned_as_the_trainer_composes_it():
    study = load_study(STUDY)
    runs = study.select(["9m/bf16/seed0", "48m/nvfp4/seed1"])
    planned, side_by_side = plan_study_runs(runs, "H100")
    small, large = planned
    for entry in planned:  # the same numbers as plan_run on the run's own composed config
        plan = plan_run(compose(entry.run.trainer_arguments()), device_spec("H100"), 1)
        assert entry.step_time_s == plan.step_time_s and entry.peak_gib == plan.peak_memory_gib
        assert entry.alone_s == pytest.approx(entry.steps * plan.step_time_s)
    assert (small.steps, large.steps) == (1400, 7340) and large.params > 4 * small.params
    assert large.alone_s > 10 * small.alone_s and large.peak_gib > small.peak_gib
    per_process = SIDE_BY_SIDE_MEMORY_FACTOR * large.peak_gib + CUDA_RESERVED_GIB  # the largest run decides
    assert side_by_side == math.floor(device_spec("H100").memory_gib / per_process) >= 1
    nine_only, nine_side_by_side = plan_study_runs(runs[:1], "H200")
    assert nine_side_by_side > side_by_side  # a larger card and smaller runs: more side by side
    table = render_plan(planned, side_by_side, "H100")
    assert "9m/bf16/seed0" in table and "48m/nvfp4/seed1" in table and f"{side_by_side} fit side by side" in table


def test_the_command_plans_only_what_is_not_done_and_names_an_unknown_gpu():
    def plan(*arguments):
        return subprocess.run([sys.executable, str(REPOSITORY / "scripts" / "run_study.py"), "--study", str(STUDY),
                               *arguments], cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(REPOSITORY), "PATH": "/usr/bin:/bin"})

    done = plan("--only", "9m/bf16/*", "19m/bf16/seed0", "--plan", "H200")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[1:-1]]
    assert rows == ["19m/bf16/seed0"] and "1 run(s) on one H200" in done.stdout  # 9m/bf16: completed
    unknown = plan("--only", "19m/bf16/seed0", "--plan", "H900")
    assert unknown.returncode != 0 and "unknown GPU 'H900'" in unknown.stderr
