"""Quantization diagnostics during training, every `logging.quant_diagnostics_every` steps.

On a due step the recorder (models.quant.diagnostics) keeps a small sample of each quantized
linear's input X and output gradient dY; after the step, each GEMM operand (X, W, dY, and the
along-token orientations of Wgrad) is quantized as its GEMM quantizes it and measured: relative
error, share flushed to zero, share of block scales that saturate or underflow, amax. Cost: a
few rows per layer, on no other step (the hooks stay idle unless armed).

Outputs (rank 0): one line per due step in `<run dir>/quant_diagnostics.jsonl`, the same
numbers in W&B as one table per due step (`quant/diagnostics`, layer x operand rows) plus a
heatmap of the relative error (`quant/rel_error`; trainer/wandb_report.py), and a printed
ranking of layers that would rather stay in BF16. Under FSDP the weight measured is
rank 0's shard; X and dY are rank 0's micro-batch.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from models.quant.diagnostics import DiagnosticsRecorder, collect_layer_diagnostics, render_summary, summarize
from trainer.wandb_report import quant_payload


class QuantDiagnostics:
    def __init__(self, model, plan, every: int, logger, run_dir: Path, is_main: bool):
        self.every = every if plan.modules and plan.backend != "te" else 0
        self.model = model
        self.logger = logger
        self.is_main = is_main
        self.path = Path(run_dir) / "quant_diagnostics.jsonl"
        self.recorder = DiagnosticsRecorder(model) if self.every and is_main else None
        if every and plan.backend == "te" and is_main:
            print("note: quantization diagnostics are not collected for the te backend "
                  "(TE's quantizers are not inspectable from here)", flush=True)

    def due(self, step: int) -> bool:
        """`step` is the 0-based index of the step about to run."""
        return bool(self.recorder) and (step + 1) % self.every == 0

    def recording(self, step: int):
        return self.recorder.recording() if self.due(step) else contextlib.nullcontext()

    def report(self, step: int) -> None:
        """After a due step (`step` = steps completed): measure, log, rank."""
        if not self.recorder or step % self.every:
            return
        records = collect_layer_diagnostics(self.model, self.recorder, seed=step)
        self.recorder.clear()
        ranked = summarize(records)
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"step": step, "records": records,
                                     "bf16_candidates": [r["layer"] for r in ranked if r["bf16_candidate"]]},
                                    default=float) + "\n")
        if self.logger.wandb_active:
            self.logger.log_values(step, quant_payload(records, step))
        self.logger.event(step, "quant_diagnostics", layers=len({r["layer"] for r in records}),
                          bf16_candidates=sum(r["bf16_candidate"] for r in ranked))
        print(render_summary(ranked), flush=True)
