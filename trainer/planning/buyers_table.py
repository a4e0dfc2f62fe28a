"""The table a buyer reads in docs/planning.md: the 12B in NVFP4 for 10T tokens, parallel=auto against fsdp_ac.

    python -m trainer.planning.buyers_table            # print the table
    python -m trainer.planning.buyers_table --write    # replace it in docs/planning.md between its markers

Every row is the planner's (trainer.planning.auto.choose_layout for parallel=auto, plan_run for the fixed
parallel=fsdp_ac): modelled, not measured; tests/trainer/test_planning_buyers_table.py checks that the doc
holds what this prints.
"""

from __future__ import annotations

import argparse
import re
from functools import lru_cache
from pathlib import Path
from typing import List, Sequence

from trainer.config import compose
from trainer.hardware import GPUS
from trainer.planning.auto import choose_layout
from trainer.planning.plan import plan_run, short_layout
from trainer.validate import ConfigError

EXPERIMENT = ["+experiment=nvfp4_12b", "parallel=auto"]
FIXED = ["+experiment=nvfp4_12b", "parallel=fsdp_ac"]
GPU_KINDS = ("B200", "GB200", "H100")
GPU_COUNTS = (8, 64, 256, 1024, 2048)
TOKENS = 10e12
DOC = Path(__file__).resolve().parents[2] / "docs" / "planning.md"
BEGIN, END = "<!-- buyers-table:begin -->", "<!-- buyers-table:end -->"
HEADER = ("| GPU | GPUs | parallel=auto layout | batch | step s | MFU | days to 10T | GPU-hours | fsdp_ac MFU | "
          "fsdp_ac days |\n|---|---|---|---|---|---|---|---|---|---|")


@lru_cache(maxsize=4)
def _config(overrides: tuple):
    return compose(list(overrides))


def _fixed_cells(gpu: str, gpus: int) -> List[str]:
    """fsdp_ac's MFU and days, or why it cannot run."""
    try:
        plan = plan_run(_config(tuple(FIXED)), GPUS[gpu], gpus, token_budget=TOKENS)
    except ConfigError as error:
        reason = "batch" if "global_batch_size" in str(error) else "config"
        return [f"refused ({reason})", "-"]
    if not plan.fits:
        return [f"refused ({plan.peak_memory_gib:.0f} GiB)", "-"]
    return [f"{100 * plan.mfu:.1f}%", f"{plan.days_to_token_budget:,.1f}"]


def table_row(gpu: str, gpus: int) -> str:
    """One row: auto's layout, batch, step, MFU, days and GPU-hours; fsdp_ac's MFU and days."""
    choice = choose_layout(_config(tuple(EXPERIMENT)), GPUS[gpu], gpus, token_budget=TOKENS)
    plan = choice.plan
    if not plan.fits:
        auto = ["nothing fits", "-", "-", "-", "-", "-"]
    else:
        auto = [short_layout(plan.layout), str(plan.layout.global_batch), f"{plan.step_time_s:.2f}",
                f"{100 * plan.mfu:.1f}%", f"{plan.days_to_token_budget:,.1f}", f"{plan.gpu_hours:,.0f}"]
    return "| " + " | ".join([gpu, str(gpus), *auto, *_fixed_cells(gpu, gpus)]) + " |"


def render(gpus: Sequence[str] = GPU_KINDS, counts: Sequence[int] = GPU_COUNTS) -> str:
    """The whole table (header and rows)."""
    return "\n".join([HEADER, *(table_row(gpu, count) for gpu in gpus for count in counts)])


def replace_in(text: str, table: str) -> str:
    """``text`` with the table between the markers replaced."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{BEGIN} ... {END} not found")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text)


def table_in(text: str) -> str:
    """The table the doc holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    args = parser.parse_args(argv)
    table = render()
    if args.write:
        DOC.write_text(replace_in(DOC.read_text(), table))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
