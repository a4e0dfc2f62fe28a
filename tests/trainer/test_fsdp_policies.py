"""FSDP2's gather and reduction policies through the trainer (torchrun, gloo, CPU processes): two data-parallel
ranks, two micro-batches each a step, train the losses one process trains on the whole batch, whichever policy
frees the gathered parameters (parallel.reshard) and reduces the gradients (parallel.grad_reduce). Under
reshard=per_micro_batch the embedding is freed after its forward and not gathered for its backward
(trainer.distributed.apply_fsdp), so its gradient comes from the token ids and the output's gradient alone; a
wrong or missing embedding gradient would part the losses from the second step on."""

from __future__ import annotations

import pytest

from trainer_testing import losses_by_step, run_cli, tiny_overrides

POLICIES = [("per_micro_batch", "per_micro_batch"), ("per_step", "per_step")]


@pytest.mark.distributed
def test_two_ranks_accumulating_train_as_one_process_under_each_policy(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=3) + ["precision=bf16", "train.micro_batch_size=1",
                                                  "train.global_batch_size=4", "train.eval_every=0"]
    single = run_cli(args + ["train.micro_batch_size=4"], tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]
    expected = losses_by_step(tmp_path / "single")
    assert sorted(expected) == [1, 2, 3]
    for reshard, grad_reduce in POLICIES:
        run_dir = tmp_path / f"{reshard}-{grad_reduce}"
        split = run_cli(args + [f"parallel.reshard={reshard}", f"parallel.grad_reduce={grad_reduce}"], run_dir,
                        nproc=2, timeout=600)
        assert split.returncode == 0, split.stderr[-3000:]
        got = losses_by_step(run_dir)
        assert sorted(got) == [1, 2, 3]
        for step in got:  # the same batches and math; only the order of the sums differs
            assert got[step] == pytest.approx(expected[step], rel=1e-4), (reshard, grad_reduce, step)
