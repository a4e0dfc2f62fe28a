"""Plan a training run before it runs: layout, memory per GPU, step time, throughput, MFU, days and GPU-hours.

    python -m trainer.plan_run +experiment=nvfp4_12b parallel=auto --gpu B200 --gpus 64 --tokens 10e12
    python -m trainer.plan_run model=slice_12b data.seq_len=8192 train.micro_batch_size=1 \
        train.global_batch_size=1 parallel.compile=true precision=bf16 --gpu H200 --gpus 1 --json

Overrides are the trainer's (`python -m trainer` composes the same config and validates it the same way);
--gpu is one of trainer/hardware.py's GPUs or CPU (this host, its RAM shared by the processes of one
node, as the trainer's preflight sees it). Nothing is built on a device: the plan comes from the
dimensions (trainer/planning; docs/planning.md says what it counts, how it was calibrated and what it
leaves out). With parallel=auto the plan is of the layout the trainer would choose, printed in one line;
for an explicit layout, how much slower it is than that choice. --json prints one object
(schema_version, the layout, the batch run, the collectives, ...). Exit status 0 whether or not the run
fits; 2 with one line `ConfigError: ...` for a config or argument the trainer would refuse.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from data.errors import DataError
from trainer.__main__ import composition_refusal, override_refusal, user_error_message
from trainer.config import compose
from trainer.hardware import GPUS
from trainer.planning import plan_run, smallest_changes
from trainer.planning.auto import explicit_vs_auto
from trainer.planning.commands import (cost_line, device_for_plan, launch_command, plan_command, with_override,
                                     with_overrides)
from trainer.startup import settle_config
from trainer.validate import ConfigError


class Refused(Exception):
    """A refusal already worded as `python -m trainer` words it (an unknown key, a config that does not compose)."""


def check_arguments(args) -> None:
    """ConfigError for arguments the planner cannot plan (as the trainer refuses a bad field)."""
    if args.gpus < 1:
        raise ConfigError(f"--gpus must be a positive integer, got {args.gpus}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be a positive integer, got {args.gpus_per_node}")
    for flag, value in (("--tokens", args.tokens), ("--gpu-hour-price", args.gpu_hour_price)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} must be a finite number > 0, got {value}")


def plan(args):
    """(plan, cfg, gpu, auto choice or None, slower-than-auto fraction or None); ConfigError as the trainer's."""
    check_arguments(args)
    refusal = override_refusal(args.overrides)  # a misspelt key: the trainer's own check, before composing
    if refusal:
        raise Refused(refusal)
    try:
        cfg = compose(args.overrides, config_dir=args.config_dir)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as error:
        raise Refused(composition_refusal(error)) from error
    gpu = device_for_plan(args.gpu, args.gpus, args.gpus_per_node)
    settled = settle_config(cfg, gpu, args.gpus, args.gpus_per_node)  # the trainer's checks, auto and batch
    if settled.choice is not None:
        run = plan_run(settled.choice.config, gpu, args.gpus, args.gpus_per_node, token_budget=args.tokens)
        return run, cfg, gpu, settled.choice, None
    explicit = plan_run(cfg, gpu, args.gpus, args.gpus_per_node, token_budget=args.tokens)
    choice, slower = explicit_vs_auto(cfg, gpu, args.gpus, args.gpus_per_node, args.tokens, plan=explicit)
    return explicit, cfg, gpu, choice, slower


def print_text(args, run, cfg, gpu, choice, slower) -> None:
    node = run.layout.gpus_per_node
    if cfg.parallel.auto:
        print(choice.line())
        print("Compared (seconds per token):\n" + choice.comparison())
    print(run.render())
    print(cost_line(run, args.gpu_hour_price))
    if not cfg.parallel.auto and slower is not None:
        auto_line = plan_command(with_override(args.overrides, "parallel", "auto"), args.gpu, args.gpus,
                                 args.gpus_per_node)
        print(f"parallel=auto: {100 * slower:.1f}% slower than the layout parallel=auto picks ({choice.line()}); "
              f"plan it: {auto_line}")
    if run.fits:
        print(f"Start it: {launch_command(args.overrides, run.layout.gpus, node)}")
        return
    if cfg.parallel.auto:
        print(f"No layout fits {run.layout.gpus} x {run.layout.gpu.name}: plan more GPUs (--gpus) or larger ones.")
        return
    changes = smallest_changes(cfg, gpu, args.gpus, args.gpus_per_node)
    print("Would fit:" if changes else "No single change of activation checkpointing, micro-batch or GPU "
          "count makes it fit.")
    for change in changes[:3]:
        line = plan_command(with_overrides(args.overrides, change.overrides), args.gpu, change.gpus, args.gpus_per_node)
        print(f"  {change.description}: peak {change.plan.peak_memory_gib:.1f} GiB, step "
              f"{change.plan.step_time_s:.3f} s: {line}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.plan_run", description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, as for python -m trainer")
    parser.add_argument("--gpu", default="H200", help=f"one of {', '.join(GPUS)}, CPU (default H200)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) in all: tp x cp x data-parallel ranks")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node (default: the GPU's NVLink domain: 8, or 72 for GB200/GB300)")
    parser.add_argument("--tokens", type=float, default=None,
                        help="token budget (default: train.steps x global batch x sequence length)")
    parser.add_argument("--gpu-hour-price", type=float, default=None, help="price of one GPU-hour, for the cost line")
    parser.add_argument("--config-dir", default=None, help="a folder of one's own configs, as the trainer's")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    args = parser.parse_intermixed_args(argv)  # overrides before and after the options
    try:
        run, cfg, gpu, choice, slower = plan(args)
    except Refused as refused:  # printed as `python -m trainer` prints it
        print(refused, file=sys.stderr)
        return 2
    except (ConfigError, DataError, ValueError) as error:  # a bad value or GPU name: the trainer's message
        print(user_error_message(error if isinstance(error, (ConfigError, DataError)) else ConfigError(str(error))),
              file=sys.stderr)
        return 2
    if args.json:
        out = run.as_dict()
        out["auto"] = None if choice is None else {"line": choice.line(), "overrides": choice.overrides(),
                                                   "fits": choice.fits, "slower_than_auto": slower}
        out["gpu_hour_price"] = args.gpu_hour_price
        print(json.dumps(out, indent=1))
        return 0
    print_text(args, run, cfg, gpu, choice, slower)
    return 0


if __name__ == "__main__":
    sys.exit(main())
