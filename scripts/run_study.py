"""Run runs of the precision study side by side on one GPU and collect their results.

    python scripts/run_study.py --runs bf16,fp8,nvfp4 --out results/study
    python scripts/run_study.py --runs nvfp4 --out /tmp/probe --set train.steps=60     # a throughput probe

The runs are defined in results/study/runs.yaml (experiment + overrides each). The corpus is
prepared once first (scripts/prepare_data.py, all cores), then every selected run starts as
its own `python -m trainer` process at the same time: a model this small leaves most of an
H200 idle, so several processes raise the aggregate tokens/s (docs/study.md has the
measurement). Each run writes into <out>/<run>/: metrics.jsonl, events.jsonl,
precision_plan.txt, config.yaml (the resolved config), train.log, and run.json (command,
wall time, what ran beside it, the GPU and versions). A run that exists there with a
run.json whose exit code is 0 is not run again unless --force. The work: reports/study.py.
"""

from __future__ import annotations

import argparse
import sys

from reports.study import RESULTS, load_study, run_study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="comma-separated run names of results/study/runs.yaml, or 'all'")
    parser.add_argument("--out", default=str(RESULTS), help="results root (one folder per run)")
    parser.add_argument("--work", default="/tmp/study_runs", help="where the runs write while training")
    parser.add_argument("--prepared-dir", default="/tmp/study_data", help="data.prepared_dir shared by the runs")
    parser.add_argument("--set", nargs="*", default=[], help="extra trainer overrides for every run (probes)")
    parser.add_argument("--skip-steps", type=int, default=50, help="steps left out of the tokens/s median")
    parser.add_argument("--force", action="store_true", help="run again even where results exist")
    parser.add_argument("--stop-after", type=float, default=None,
                        help="seconds after which every run gets SIGTERM: it checkpoints and exits (a later call "
                             "with the same --work resumes it)")
    parser.add_argument("--fresh", action="store_true", help="delete the runs' work directories first (no resume)")
    arguments = parser.parse_args(argv)

    names = list(load_study()["runs"]) if arguments.runs == "all" else arguments.runs.split(",")
    try:
        return run_study(names, arguments.out, arguments.work, arguments.prepared_dir, arguments.set,
                         skip_steps=arguments.skip_steps, force=arguments.force, stop_after=arguments.stop_after,
                         fresh=arguments.fresh)
    except ValueError as error:  # an unknown run name, before any work
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    sys.exit(main())
