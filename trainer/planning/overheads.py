"""The seconds of a run besides its training steps: start-up, compilation and evaluation.

    start-up      STARTUP_S once: the processes, imports, the data's manifests, the model built and
                  initialised, the precision pass, the checkpoint looked for
    compilation   COMPILE_S once with parallel.compile (the blocks compiled; with parallel.cuda_graph the
                  micro-step recorded as well), GRAPH_CAPTURE_S for a graph without compiled blocks
    evaluation    every train.eval_every steps and at the last step: train.eval_batches forward-only
                  micro-batches, each FORWARD_SHARE of a training micro-batch without recomputation at the
                  idle share of eager launches (evaluation is not replayed from the graph), plus under tensor
                  parallelism its forward collectives (one all-gather and one reduce-scatter per block, the
                  embedding's reduce-scatter, the LM head's all-gather, the loss's three all-reduces) and
                  under context parallelism its forward all-gathers (each Mamba layer's halo and state, each
                  attention layer's K and V)

Where the constants come from (docs/study.md and the study's records, results/study/9m/*: runs of the
9.2M-parameter study model on one H100 or H200, compiled blocks, CUDA graphs): the first three steps of a run
(compilation and the graph's recording) took 54-57 s with two or three runs compiling side by side and
130-160 s with eight or nine; a 9m NVFP4 run took 274 s with one run beside it, of which ~90 s train.
COMPILE_S = 50 is one run's compilation alone, STARTUP_S = 30 the rest of that run's wall time beside its
steps and evaluations. Neither was timed on a multi-node launch, where start-up grows with the world.
For the paper-sized runs these terms are minutes in weeks; for the study size they are most of the run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict

from models.config import ModelConfig
from trainer.planning.collectives import (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, TP, Collective, call_seconds,
                                          cp_collectives)
from trainer.planning.layout import RunLayout
from trainer.planning.step_time import FORWARD_SHARE, H200_CALIBRATED, Efficiency, micro_batch_parts

STARTUP_S = 30.0
"""Seconds from launch to the first step besides compilation (the module docstring: the study's runs)."""
COMPILE_S = 50.0
"""Seconds the first steps spend compiling the blocks (and recording the CUDA graph): 54-57 s measured with
two or three runs compiling side by side on one 16-core host."""
GRAPH_CAPTURE_S = 5.0
"""Seconds to record the micro-step's CUDA graph without compiled blocks (a few eager warm-up steps)."""


def evaluations(steps: int, eval_every: int) -> int:
    """Evaluations in ``steps`` steps: every eval_every steps and at the last one."""
    if eval_every <= 0 or steps <= 0:
        return 0
    return steps // eval_every + (1 if steps % eval_every else 0)


def evaluation_seconds(model: ModelConfig, layout: RunLayout, eval_batches: int,
                       eff: Efficiency = H200_CALIBRATED) -> float:
    """Seconds of one evaluation: eval_batches forward-only micro-batches (module docstring)."""
    plain = dataclasses.replace(layout, checkpointed="", cuda_graph=False)
    forward = FORWARD_SHARE * sum(micro_batch_parts(model, plain, eff).values()) * (1 + eff.idle)
    if layout.tp > 1:  # each block's gather and scatter, the embedding's scatter, the LM head's gather, the loss's
        activation = layout.compute_bytes * layout.tokens_per_micro_batch * model.hidden_size
        calls = len(model.pattern) + 1
        forward += calls * sum(call_seconds(Collective(op, TP, layout.tp, activation, 1, "", ""), layout, eff.network)
                               for op in (ALL_GATHER, REDUCE_SCATTER))
        loss = Collective(ALL_REDUCE, TP, layout.tp, 4 * layout.tokens_per_micro_batch, 1, "", "")
        forward += 3 * call_seconds(loss, layout, eff.network)
    # context parallelism's forward gathers (halo, state, K/V) of one micro-batch, nothing recomputing
    one = dataclasses.replace(plain, accumulation=1)
    forward += sum(c.calls_per_step * call_seconds(c, one, eff.network)
                   for c in cp_collectives(model, one) if c.op == ALL_GATHER)
    return eval_batches * forward


def run_overheads(model: ModelConfig, layout: RunLayout, steps: int, eval_every: int, eval_batches: int,
                  eff: Efficiency = H200_CALIBRATED) -> Dict[str, float]:
    """Seconds of a run of ``steps`` steps besides the steps themselves, by part."""
    compile_s = COMPILE_S if layout.compiled else GRAPH_CAPTURE_S if layout.cuda_graph else 0.0
    count = evaluations(steps, eval_every)
    return {"start-up": STARTUP_S, "compilation": compile_s,
            "evaluation": count * evaluation_seconds(model, layout, eval_batches, eff) if count else 0.0}


def steps_for_tokens(tokens: float, tokens_per_step: int) -> int:
    """Optimizer steps to train ``tokens`` tokens."""
    return max(1, math.ceil(tokens / tokens_per_step)) if math.isfinite(tokens) and tokens > 0 else 0
