"""trainer.planning.batch: the global batch a layout runs (train.batch_policy), and its refusals."""

from __future__ import annotations

import pytest

from trainer.config import compose
from trainer.hardware import GPUS
from trainer.planning.auto import choose_layout
from trainer.planning.batch import gpu_counts_for_batch, nearest_multiple, resolve_batch, resolve_global_batch
from trainer.validate import ConfigError

PAPER_COUNTS = [1, 2, 4, 8, 16, 23, 32, 46, 92, 184, 368, 736]
"""GPU counts that run the paper's 736 sequences at micro-batch 1 (736 = 2^5 x 23)."""


def test_the_configured_batch_when_it_divides():
    batch = resolve_global_batch(736, 1, 8)
    assert (batch.global_batch, batch.accumulation, batch.adjusted) == (736, 92, False)
    assert batch.announcement() == ""


def test_nearest_takes_the_nearest_multiple_ties_up_within_the_tolerance():
    assert nearest_multiple(736, 64) == 768  # 704 and 768 are both 32 away: up
    assert nearest_multiple(730, 64) == 704 and nearest_multiple(10, 64) == 64
    batch = resolve_global_batch(736, 1, 64)
    assert (batch.global_batch, batch.accumulation, batch.adjusted) == (768, 12, True)
    assert batch.deviation == pytest.approx(32 / 736)
    assert batch.announcement().startswith("train.global_batch_size 736 -> 768 (+4.3%)")
    assert batch.event_fields() == {"configured": 736, "global_batch": 768, "micro_batch": 1, "dp_ranks": 64,
                                    "accumulation": 12, "policy": "nearest"}


def test_a_batch_beyond_the_tolerance_is_refused_in_one_line_with_the_counts_that_run_it():
    with pytest.raises(ConfigError) as refused:
        resolve_global_batch(736, 1, 2048)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("train.global_batch_size (736) cannot run on 2048 GPUs")
    assert "train.batch_tolerance (0.05)" in message and "train.batch_policy=nearest" in message
    assert message.endswith("GPU counts that run 736 at micro-batch 1 and tp 1: " + ", ".join(map(str, PAPER_COUNTS)))


def test_exact_refuses_any_other_batch_and_says_what_nearest_would_run():
    with pytest.raises(ConfigError, match=r"train.batch_policy=exact \(nearest would run 768, 4.3% away\)"):
        resolve_global_batch(736, 1, 64, policy="exact")
    assert resolve_global_batch(736, 1, 32, policy="exact").global_batch == 736
    with pytest.raises(ConfigError, match="train.batch_tolerance"):
        resolve_global_batch(736, 1, 64, tolerance=0.0)


def test_gpu_counts_that_run_a_batch():
    assert gpu_counts_for_batch(736, 1) == PAPER_COUNTS
    assert gpu_counts_for_batch(736, 2) == [1, 2, 4, 8, 16, 23, 46, 92, 184, 368]
    assert gpu_counts_for_batch(736, 1, tp=8) == [8 * n for n in PAPER_COUNTS if 8 * n <= 4096]


def test_resolve_batch_reads_the_config_and_divides_the_world_by_tp():
    cfg = compose(["+experiment=nvfp4_12b", "parallel.tp=8"])
    batch = resolve_batch(cfg, 2048)  # 256 data-parallel ranks
    assert (batch.dp_ranks, batch.global_batch, batch.accumulation) == (256, 768, 3)
    with pytest.raises(ConfigError, match="parallel.tp"):
        resolve_batch(cfg, 12)


@pytest.mark.parametrize("nodes", [1, 2, 4, 8, 16, 32, 64, 128])
def test_the_12b_runs_on_every_node_count_of_the_readme_with_auto(nodes):
    """1 to 128 nodes of 8 B200: parallel=auto finds a layout whose batch the policy accepts, and it fits."""
    choice = choose_layout(compose(["+experiment=nvfp4_12b", "parallel=auto"]), GPUS["B200"], 8 * nodes)
    assert choice.fits
    assert abs(choice.plan.layout.global_batch - 736) <= 0.05 * 736
