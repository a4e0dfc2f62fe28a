"""Every GEMM of a training step, its FLOPs, and what each low-precision format buys on each GPU.

    python -m reports.gemm_report --config hybrid_12b                      # theory, no GPU needed
    python -m reports.gemm_report --config hybrid_12b --precision nvfp4 --csv gemms_12b.csv
    python -m reports.gemm_report --config hybrid_12b --measure            # + timings on this GPU

--config is a name under configs/model/ or a yaml path; --tokens is the tokens of one micro-batch
(default 8192), --seq-len the sequence length (default --tokens: one sequence). The GEMM list comes
from models.gemms (Fprop, Dgrad, Wgrad of every linear; attention BMMs, always BF16). --precision
names a recipe of configs/precision/ (or a yaml path): the report marks which GEMMs that recipe keeps
in BF16 (first/last pattern symbols, lm_head, globs, GEMMs the recipe leaves unquantized) exactly as
the trainer's precision pass (models.quant.recipe.plan_layers) decides, and adds the step speedup of
the recipe.

The cost model (formulas, assumptions, bytes per format) is trainer/planning/gemm_costs.py; the report,
its tables and CSV reports/gemm_report.py.

--measure times each distinct linear GEMM shape on the present CUDA GPU (CUDA events, median of
--iters after --warmup) in BF16, FP8 tensorwise and blockwise, MXFP8 and NVFP4 where the GPU has
them: benchmarks/gemm_timing.py says how.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from trainer.planning.gemm_costs import DEFAULT_FORMATS, OVERHEAD_MODES
from reports.gemm_report import Report, build_report, load_model_config, load_precision_config, measure, render, write_csv
from trainer.hardware import GPUS


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reports.gemm_report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="model config: a name under configs/model/ or a yaml path")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (default 8192)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default: --tokens)")
    parser.add_argument("--precision", default=None,
                        help="precision recipe (configs/precision/ name or yaml): mark the GEMMs it keeps in BF16")
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                        help=f"comma-separated formats to compare with BF16 (default {','.join(DEFAULT_FORMATS)}; "
                             f"also: fp8_tensor, mxfp4)")
    parser.add_argument("--gpus", default=",".join(GPUS), help=f"comma-separated GPUs (default {','.join(GPUS)})")
    parser.add_argument("--overhead", choices=OVERHEAD_MODES, default="sum",
                        help="how quantization traffic adds to GEMM time (default sum)")
    parser.add_argument("--csv", type=Path, default=None, help="write every GEMM (one row each) to this CSV")
    parser.add_argument("--measure", action="store_true", help="time each distinct linear GEMM on this CUDA GPU")
    parser.add_argument("--warmup", type=int, default=5, help="--measure: warm-up launches per GEMM")
    parser.add_argument("--iters", type=int, default=20, help="--measure: timed launches per GEMM (median)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Report:
    args = parse_args(argv)
    cfg = load_model_config(args.config)
    precision = load_precision_config(args.precision) if args.precision else None
    report = build_report(
        cfg, tokens=args.tokens, seq_len=args.seq_len, precision=precision,
        gpus=[g.strip() for g in args.gpus.split(",") if g.strip()],
        formats=[f.strip() for f in args.formats.split(",") if f.strip()], overhead=args.overhead,
    )
    if args.measure:
        measure(report, warmup=args.warmup, iters=args.iters)
    print(render(report))
    if args.csv is not None:
        write_csv(report, args.csv)
        print(f"\nwrote {len(report.gemms)} GEMMs to {args.csv}")
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise SystemExit(f"gemm_report: {error}") from None
