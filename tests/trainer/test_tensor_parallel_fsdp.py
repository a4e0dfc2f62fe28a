"""Tensor parallelism composed with FSDP2 (torchtitan's order: TP first, then ``fully_shard`` over the
data-parallel submesh of the same mesh), and distributed checkpoints resharded between TP degrees.

Four gloo processes, mesh (dp_shard=2, tp=2), the tiny hybrid in fp32 (BF16 recipe): three AdamW steps
with gradient clipping, each on the same global batch of 4 sequences as one process takes it whole
(dp rank d gets sequences 2d, 2d+1; its two tp ranks the same two, each computing half of their
tokens' mixers and half of their vocabulary). The minimal training step is written here, as
trainer/loop.py runs it: the loss over the tp group (``cross_entropy``), backward,
``reduce_tp_replicated_grads``, clip, step. Then a DCP save of model and optimizer
(2-D DTensors) is loaded into a plain one-process model and AdamW: identical parameters and states; and a
full state dict loads into the sharded model (rank 0's, broadcast: checkpoint.init_from_hf's way) and
gathers back whole (the HF export's way).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from test_tensor_parallel import build, run_ranks, tp_config

STEPS, LR, CLIP = 3, 3e-3, 0.5


def _batches():
    generator = torch.Generator().manual_seed(11)
    vocab = tp_config().vocab_size
    return [(torch.randint(0, vocab, (4, 64), generator=generator), torch.randint(0, vocab, (4, 64), generator=generator))
            for _ in range(STEPS)]


def _optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, foreach=False)


def _train_worker(rank: int, world: int, out_dir: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                         set_model_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from trainer.config import ParallelConfig
    from trainer.distributed import DistEnv, apply_fsdp
    from trainer.tensor_parallel import apply_tensor_parallel, cross_entropy, reduce_tp_replicated_grads

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp_shard"]
    tp, dp_rank = tp_mesh.size(), dp_mesh.get_local_rank()
    model = build(tp_config())
    apply_tensor_parallel(model, tp_mesh)
    # The trainer's units (the embedding, each block, the head, the root), in fp32 as the one-process reference.
    env = DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), mesh=mesh, tp=tp)
    apply_fsdp(model, env, ParallelConfig(reduce_dtype="float32"), torch.float32)
    optimizer = _optimizer(model)
    losses, norms = [], []
    for ids, labels in _batches():
        mine = slice(2 * dp_rank, 2 * dp_rank + 2)
        logits = model(ids[mine])
        loss = cross_entropy(logits, labels[mine], tp_mesh)  # the dp rank's two sequences, on both tp ranks
        loss.backward()
        reduce_tp_replicated_grads(model)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=False)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)  # sum over ranks of the dp rank's mean = tp x dp x the global mean
        losses.append(total.item() / (dp_mesh.size() * tp))
        norms.append(norm.full_tensor().item())
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=str(Path(out_dir) / "checkpoint"))
    full = {name: param.full_tensor() for name, param in model.named_parameters()}
    states = {name: {key: value.full_tensor() if hasattr(value, "full_tensor") else value for key, value in state.items()}
              for name, state in optimizer_state["state"].items()}
    if rank == 0:
        torch.save({"params": full, "states": states}, Path(out_dir) / "full.pt")
        (Path(out_dir) / "losses.json").write_text(json.dumps({"losses": losses, "norms": norms}))

    # Full state dicts, as checkpoint.init_from_hf loads them (rank 0's, broadcast) and the HF export gathers them.
    initial = build(tp_config()).state_dict()
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(initial) if rank == 0 else {}, options=options)  # (it rewrites the dict)
    for name, param in model.named_parameters():
        assert torch.equal(param.full_tensor(), initial[name]), name
    gathered = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        assert all(torch.equal(gathered[name], tensor) for name, tensor in initial.items())


@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the TP=1 load runs in this one process
def test_tp2_x_fsdp2_trains_as_one_process_and_its_checkpoint_loads_at_tp1(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    run_ranks(_train_worker, 4, str(tmp_path))
    recorded = json.loads((tmp_path / "losses.json").read_text())

    # One process, the global batch whole.
    model = build(tp_config())
    optimizer = _optimizer(model)
    losses, norms = [], []
    for ids, labels in _batches():
        loss = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=False).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert recorded["losses"] == pytest.approx(losses, rel=1e-5)
    assert recorded["norms"] == pytest.approx(norms, rel=1e-4)
    saved = torch.load(tmp_path / "full.pt")
    for name, param in model.named_parameters():  # Adam's steps are ~lr each whatever the gradient's size, so
        # an element whose gradient is near 0 moves by up to ~lr on summation-order noise: a tenth of lr
        torch.testing.assert_close(saved["params"][name], param.detach(), rtol=0, atol=0.1 * LR, msg=name)

    # The TP=2 x dp=2 checkpoint into a plain model and optimizer (TP=1, one process): the same numbers.
    plain = build(tp_config(), seed=99)
    plain_optimizer = _optimizer(plain)
    model_state, optimizer_state = get_state_dict(plain, plain_optimizer)  # (initializes the Adam states)
    state = {"model": model_state, "optim": optimizer_state}
    dcp.load(state, checkpoint_id=str(tmp_path / "checkpoint"))
    set_state_dict(plain, plain_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, param in plain.named_parameters():
        assert torch.equal(param.detach(), saved["params"][name]), name
    loaded = get_state_dict(plain, plain_optimizer)[1]["state"]
    assert set(loaded) == set(saved["states"])
    for name, states in saved["states"].items():
        for key, value in states.items():
            assert torch.equal(torch.as_tensor(loaded[name][key]), torch.as_tensor(value)), (name, key)
