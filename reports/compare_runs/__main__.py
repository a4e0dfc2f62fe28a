"""Compare the loss curves of training runs: align on tokens, plot, and print the relative difference.

    python -m reports.compare_runs runs/fp8_12b runs/nvfp4_12b --smooth ema:0.9 --out fp8_vs_nvfp4.png
    python -m reports.compare_runs runs/bf16 runs/fp8 runs/nvfp4 --labels bf16 fp8 nvfp4 --val
    python -m reports.compare_runs runs/fp8 runs/nvfp4 --wandb-report              # + the figure to W&B (offline)
    python -m reports.compare_runs wandb:me/hybrid-nvfp4/abc123 wandb:me/hybrid-nvfp4/def456 --wandb-online
    python -m reports.compare_runs runs/bf16_s0,runs/bf16_s1,runs/bf16_s2 runs/nvfp4_s0,runs/nvfp4_s1,runs/nvfp4_s2 \
        --labels bf16 nvfp4 --out seeds.png        # seed groups: paired gaps with 95% confidence intervals

A RUN with commas is a group of run directories, one per seed: every RUN must then be a group of
the same size, paired by position (the same seed order), and the comparison is the study report's
(study/report.py: gaps to the first group on the final and last-30% validation loss with 95% t
intervals, the growth of the gap in the decay phase, the figure with CI bands).

What a RUN may be, the method (smoothing, alignment, phases, noise band) and the numbers:
reports/compare_runs/__init__.py. Seed groups are the study's report: this command line imports
study/, as the scripts do (the library does not).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from reports.compare_runs import compare_runs
from study.report import compare_seed_groups


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reports.compare_runs", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories, metrics.jsonl files or wandb:entity/project/id; "
                                                "the first is the reference A")
    parser.add_argument("--labels", nargs="+", default=None, help="one label per run (default: directory names)")
    parser.add_argument("--smooth", default="none", help="none | ema:B | window:N (default none)")
    parser.add_argument("--out", type=Path, default=Path("compare_runs.png"), help="PNG to write")
    parser.add_argument("--val", action="store_true", help="also compare val_loss (where both runs logged it)")
    parser.add_argument("--decay-start-tokens", type=float, default=None,
                        help="tokens where the decay phase starts, in every run (default: from each run's lr column)")
    parser.add_argument("--stable-start-tokens", type=float, default=None,
                        help="tokens where the stable phase starts, in every run (default: each run's first point at max lr)")
    parser.add_argument("--noise", default=None,
                        help="a run that differs from A only in its seed: its difference to A is drawn as a band")
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers to this JSON file")
    parser.add_argument("--wandb-online", action="store_true", help="allow wandb:entity/project/id runs (wandb.Api)")
    parser.add_argument("--wandb-report", action="store_true", help="log the figure and numbers to a W&B run")
    parser.add_argument("--wandb-mode", choices=("offline", "online"), default="offline",
                        help="mode of the --wandb-report run (default offline)")
    parser.add_argument("--wandb-project", default="hybrid-nvfp4", help="project of the --wandb-report run")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs (the first is the reference)")
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels has {len(args.labels)} entries for {len(args.runs)} runs")
    return args


def _group_label(folders: list[str]) -> str:
    """A seed group's default label: the folder that holds all its runs (bf16/seed0,bf16/seed1 -> bf16)."""
    parents = {Path(folder).resolve().parent for folder in folders}
    return parents.pop().name if len(parents) == 1 and len(folders) > 1 else Path(folders[0]).name


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    if any("," in run for run in args.runs):
        labels = args.labels or [_group_label(run.split(",")) for run in args.runs]
        if len(set(labels)) != len(labels):
            raise SystemExit(f"seed groups need distinct labels (got {labels}): give --labels")
        try:
            return compare_seed_groups({label: [Path(p) for p in run.split(",")] for label, run in zip(labels, args.runs)},
                                       args.out, args.json)
        except (ValueError, OSError) as error:
            raise SystemExit(str(error)) from None
    return compare_runs(
        args.runs, labels=args.labels, smoothing=args.smooth, out=args.out, val=args.val,
        decay_start_tokens=args.decay_start_tokens, stable_start_tokens=args.stable_start_tokens, noise=args.noise,
        title=args.title, json_path=args.json, wandb_online=args.wandb_online, wandb_report=args.wandb_report,
        wandb_mode=args.wandb_mode, wandb_project=args.wandb_project,
    )


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise SystemExit(f"compare_runs: {error}") from None
