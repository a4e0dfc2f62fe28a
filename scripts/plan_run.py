"""Plan a training run before it runs: memory per GPU, step time, throughput, MFU and days to its tokens.

    python scripts/plan_run.py +experiment=nvfp4_12b --gpu B200 --gpus 64 train.global_batch_size=768
    python scripts/plan_run.py model=slice_12b data.seq_len=8192 train.micro_batch_size=1 \
        train.global_batch_size=1 parallel.compile=true precision=bf16 --gpu H200 --gpus 1 --json

Overrides are the trainer's (`python -m trainer` composes the same config); --gpu is one of
trainer/hardware.py's GPUs or CPU (this host). Nothing is built on a device: the plan comes from the
dimensions (trainer/planning; docs/planning.md says what it counts, how it was calibrated and what it
leaves out). --json prints one object (params, peak_memory_gib_per_gpu, step_time_s,
tokens_per_s_per_gpu, mfu, days_to_token_budget, fits, and the parts). Exit status 0 whether or not
the run fits; 2 for a config the trainer would refuse.
"""

from __future__ import annotations

import argparse
import json
import sys

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from trainer.config import compose
from trainer.hardware import GPUS, device_spec
from trainer.planning import plan_run, smallest_changes
from trainer.validate import ConfigError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, as for python -m trainer")
    parser.add_argument("--gpu", default="H200", help=f"one of {', '.join(GPUS)}, CPU (default H200)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (data-parallel ranks) in all")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node (default: the GPU's NVLink domain: 8, or 72 for GB200/GB300)")
    parser.add_argument("--tokens", type=float, default=None,
                        help="token budget (default: train.steps x global batch x sequence length)")
    parser.add_argument("--config-dir", default=None, help="a folder of one's own configs, as the trainer's")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    args = parser.parse_intermixed_args(argv)  # overrides before and after the options
    try:
        gpu = device_spec(args.gpu)
        cfg = compose(args.overrides, config_dir=args.config_dir)
        plan = plan_run(cfg, gpu, args.gpus, args.gpus_per_node, token_budget=args.tokens)
    except (ConfigError, ValueError, HydraException, OmegaConfBaseException) as error:  # a bad config or GPU name
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.as_dict(), indent=1))
        return 0
    print(plan.render())
    if not plan.fits:
        changes = smallest_changes(cfg, gpu, args.gpus, args.gpus_per_node)
        print("Would fit:" if changes else "No single change of activation checkpointing, micro-batch or GPU "
              "count makes it fit.")
        for change in changes[:3]:
            print(f"  {change.description}: peak {change.plan.peak_memory_gib:.1f} GiB, step "
                  f"{change.plan.step_time_s:.3f} s {' '.join(change.overrides)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
