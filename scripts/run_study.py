"""Run a study (arms x seeds x sizes, one YAML file) on one GPU, packed side by side, resumable.

    python scripts/run_study.py --study results/study/study.yaml                      # every run not yet completed
    python scripts/run_study.py --study results/study/study.yaml --only '9m/*/seed1' --parallel 4 --deadline 540
    python scripts/run_study.py --study results/study/study.yaml --only 9m/nvfp4/seed0 --set train.steps=60 --force
    python scripts/run_study.py --study results/study/study.yaml --list
    python scripts/run_study.py --study results/study/study.yaml --only '32m/*' --plan H100 --parallel 1 --deadline 540

The study file's format: study/definition.py. Results go beside it, one folder per run
(<size>/<arm>/seed<k>/: metrics.jsonl, events.jsonl, precision_plan.txt, config.yaml, train.log,
run.json with the source commit and the corpus hash, metrics.superseded.jsonl if steps were trained again). A completed run is not run again unless
--force; a run stopped at --deadline checkpoints, and the same command with the same --work resumes
it. What the runner does: study/runner.py.
"""

from __future__ import annotations

import argparse
import sys

from study.definition import load_study
from study.runner import completed, run_study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="the study's YAML file")
    parser.add_argument("--only", nargs="*", default=[], help="run ids or shell patterns (9m/nvfp4/seed0, '9m/*/seed1'), started in this order")
    parser.add_argument("--list", action="store_true", help="print the selected runs and whether each is done")
    parser.add_argument("--plan", metavar="GPU", default=None,
                        help="print each selected run not yet completed with its planned step time, time alone on one "
                             "GPU of this kind (trainer/hardware.py) and memory, how many fit side by side, and its "
                             "calls and wall time packed --parallel side by side in calls of --deadline seconds "
                             "(study/plan.py); runs nothing")
    parser.add_argument("--parallel", type=int, default=4, help="runs side by side on the GPU")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from this command's start (corpus preparation included): start no run that would not finish by then (guessed from finished runs), "
                             "and send SIGTERM to those still going (they checkpoint; run again to resume)")
    parser.add_argument("--work", default="/tmp/study_runs", help="where the runs write (and resume from)")
    parser.add_argument("--prepared-dir", default="/tmp/study_data", help="data.prepared_dir shared by the runs")
    parser.add_argument("--data-config", default="study", help="the configs/data entry the corpus is prepared from")
    parser.add_argument("--set", nargs="*", default=[], help="extra trainer overrides for every run (probes)")
    parser.add_argument("--skip-steps", type=int, default=50, help="steps left out of the tokens/s median")
    parser.add_argument("--force", action="store_true", help="run again even where a completed run exists")
    arguments = parser.parse_args(argv)
    try:
        study = load_study(arguments.study)
        runs = study.select(arguments.only)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if arguments.list:
        for run in runs:
            done = "done" if completed(study.results / run.id) else "todo"
            print(f"{done}  {run.id:32s} python -m trainer {' '.join(run.trainer_arguments())}")
        return 0
    if arguments.plan:
        from study.plan import plan_study_runs, render_plan

        todo = [run for run in runs if not completed(study.results / run.id)]
        try:
            planned, side_by_side = plan_study_runs(todo, arguments.plan)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        print(render_plan(planned, side_by_side, arguments.plan.upper(), arguments.parallel, arguments.deadline))
        return 0
    return run_study(study, runs, work=arguments.work, prepared_dir=arguments.prepared_dir,
                     parallel=arguments.parallel, deadline_s=arguments.deadline, extra=arguments.set,
                     force=arguments.force, skip_steps=arguments.skip_steps, data_config=arguments.data_config)


if __name__ == "__main__":
    sys.exit(main())
