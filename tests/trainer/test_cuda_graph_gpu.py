"""parallel.cuda_graph on the GPU: the trainer's micro-step recorded into a real CUDA graph and replayed.

The tiny NVFP4 run with stochastic rounding (seeds read from device tensors), gradient
accumulation, eager diagnostics steps and the late BF16 switch, against the same run without
graphs. Replays re-run the recorded kernels, so the losses agree to the run-to-run noise of the
GPU kernels (atomics in the SSD backward), and each recording is logged.
"""

from __future__ import annotations

import math

import pytest

from tests.trainer.trainer_testing import compose_train_config, read_jsonl, tiny_overrides
from trainer.loop import train

pytestmark = pytest.mark.gpu


def test_graphed_training_matches_eager_on_cuda(tmp_path, data_cache):
    overrides = tiny_overrides(data_cache, steps=8) + ["parallel.device=cuda", "precision.switch_to_bf16_at_step=4",
                                                        "logging.quant_diagnostics_every=3"]
    summaries = {}
    for graphed in (False, True):
        cfg = compose_train_config(overrides + [f"parallel.cuda_graph={str(graphed).lower()}"], tmp_path / str(graphed))
        summaries[graphed] = train(cfg)
    assert [summaries[graphed]["status"] for graphed in (False, True)] == ["completed", "completed"]
    eager, graphed = summaries[False]["losses"], summaries[True]["losses"]
    assert len(graphed) == len(eager) == 8
    assert all(math.isfinite(loss) for loss in graphed)
    for step, (got, want) in enumerate(zip(graphed, eager)):
        assert abs(got - want) <= 2e-3 * abs(want), f"step {step}: graphed {got} vs eager {want}"
    recorded = [(e["step"], e["micro_step"]) for e in read_jsonl(tmp_path / "True" / "events.jsonl")
                if e["event"] == "cuda_graph_recorded"]
    # Warm-up (0,0) (0,1) (1,0), recorded at (1,1); step 2 eager (diagnostics); BF16 from step 4:
    # warm-up (4,0) (4,1) [step 5 eager, diagnostics] (6,0), recorded again at (6,1).
    assert recorded == [(1, 1), (6, 1)]
    diagnostics = read_jsonl(tmp_path / "True" / "quant_diagnostics.jsonl")
    assert [line["step"] for line in diagnostics] == [3, 6]  # eager steps: the hooks recorded
