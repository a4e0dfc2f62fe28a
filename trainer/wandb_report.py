"""How runs and their numbers are laid out in W&B: comparison groups and quantization panels.

- Group: runs of one comparison share a W&B group. By default it is the experiment's name
  without its precision (`nvfp4_12b`, `fp8_12b`, `bf16_12b` -> `12b`; `quickstart` run with
  any `precision=` stays `quickstart`); `logging.wandb.group` sets it explicitly.
- Quantization diagnostics: one `wandb.Table` per diagnostics step (a row per layer x GEMM
  operand, the metrics as columns; W&B keeps each step's table) under `quant/diagnostics`, and
  a heatmap image of the relative error (layers x operands) under `quant/rel_error`: two keys,
  instead of one flat key per layer, operand and metric (hundreds for the 12B).
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence

from models.quant.diagnostics import METRIC_KEYS

PRECISION_NAMES = ("bf16", "fp16", "fp32", "fp8", "mxfp4", "mxfp8", "nvfp4")
"""Precision tokens stripped from an experiment's name to find its comparison group."""

_PRECISION_AFFIX = re.compile(rf"^(?:{'|'.join(PRECISION_NAMES)})[_-]|[_-](?:{'|'.join(PRECISION_NAMES)})$")

TABLE_COLUMNS = ("layer", "gemm", "operand", *METRIC_KEYS, "error")
"""Columns of the quantization diagnostics table."""


def comparison_group(experiment: str) -> str:
    """The W&B group of an experiment: its name without a leading or trailing precision token."""
    group = _PRECISION_AFFIX.sub("", experiment)
    return group or experiment


def diagnostics_rows(records: Sequence[dict]) -> List[list]:
    """One row per record, in TABLE_COLUMNS order (metrics None and `error` set where not measured)."""
    return [[record["layer"], record["gemm"], record["operand"], *(record.get(key) for key in METRIC_KEYS),
             record.get("error", "")] for record in records]


def rel_error_heatmap(records: Sequence[dict], step: int):
    """A matplotlib figure: relative error per layer (rows) and GEMM operand (columns); blank = not measured."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    layers = list(dict.fromkeys(record["layer"] for record in records))
    operands = list(dict.fromkeys(f"{record['gemm']}.{record['operand']}" for record in records))
    values = np.full((len(layers), len(operands)), np.nan)
    for record in records:
        if record.get("rel_error") is not None:
            values[layers.index(record["layer"]), operands.index(f"{record['gemm']}.{record['operand']}")] = record["rel_error"]
    figure, axes = plt.subplots(figsize=(1.2 * len(operands) + 3, 0.22 * len(layers) + 1.5))
    image = axes.imshow(values, aspect="auto", cmap="viridis")
    axes.set_xticks(range(len(operands)), operands, rotation=30, ha="right", fontsize=8)
    axes.set_yticks(range(len(layers)), layers, fontsize=6)
    axes.set_title(f"quantization relative error, step {step}")
    figure.colorbar(image, ax=axes, label="||x - q(x)|| / ||x||")
    figure.tight_layout()
    return figure


def quant_payload(records: Sequence[dict], step: int) -> Dict[str, object]:
    """{'quant/diagnostics': wandb.Table, 'quant/rel_error': wandb.Image} for one diagnostics step."""
    import matplotlib.pyplot as plt
    import wandb

    figure = rel_error_heatmap(records, step)
    try:
        image = wandb.Image(figure)
    finally:
        plt.close(figure)
    return {"quant/diagnostics": wandb.Table(columns=list(TABLE_COLUMNS), data=diagnostics_rows(records)),
            "quant/rel_error": image}
