"""Tensor parallelism with sequence parallelism (trainer/tensor_parallel.py) against one process.

Two gloo processes on the CPU (``run_ranks``), the tiny hybrid (M-M*M-: every mixer), fp32 compute:
- BF16 recipe: logits of the rank's tokens and the gradient of every parameter (gathered to the full
  tensor) equal the one-process model's up to summation order; the collectives counted per forward and
  backward are the ones the pass reports (CommDebugMode).
- NVFP4 (emulated, stochastic rounding off): each sharded operand is quantized exactly as the unsharded
  layer quantizes that slice (the next test), but the row-parallel sums run in another order, so a value
  next to a rounding boundary may round the other way; one such flip moves one token's logits, and in the
  backward the per-tensor amax couples the tokens. So: most logits equal to summation order, gradients
  within flip level (relative error < 0.2; without the amax reduction every logit moves and every
  gradient is off by > 0.4: checked as a negative control).
- The dequantized operands of a column- and a row-parallel NVFP4 layer (W, X, dY in every orientation,
  also W^T re-quantized and Four Over Six) and of the FP8 per-tensor format are bit-identical to the
  slices of the unsharded layer's, with the amax held by the other rank's shard.
The TP x FSDP2 training and the DCP reshard are tests/trainer/test_tensor_parallel_fsdp.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from models import build_model
from models.config import load_model_config
from models.quant.quantized_linear import QuantizedLinear, mix_seed

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------
# Helpers (the FSDP test imports them)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_entry(rank: int, worker, world: int, port: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        worker(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(worker, world: int, *args) -> None:
    """worker(rank, world, *args) in ``world`` processes joined in one gloo group; a failure in any re-raises
    here with its traceback. The processes fork from multiprocessing's fork server (a clean process, started
    once per session with torch and these modules imported): a few seconds per call where spawning
    processes that import torch afresh took half a minute on two busy cores."""
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "models", "trainer.tensor_parallel",
                                            __name__])
    torch.multiprocessing.start_processes(_rank_entry, args=(worker, world, free_port(), args), nprocs=world,
                                          start_method="forkserver")


def tp_config():
    """The tiny hybrid with 32 Mamba heads of 4: each group's in_proj rows (2 x 64 + 2 x 16 + 16 = 176) are
    whole NVFP4 blocks, so a tp=2 shard of in_proj is too (the tiny config's 168 per group is not)."""
    return dataclasses.replace(load_model_config("tiny"), mamba_num_heads=32, mamba_head_dim=4)


def precision_config(name: str, **overrides):
    from omegaconf import OmegaConf

    from models.quant.config import PrecisionConfig

    path = ROOT / "configs" / "precision" / f"{name}.yaml"
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrecisionConfig), OmegaConf.load(path)))
    return dataclasses.replace(cfg, **overrides)


def build(cfg, precision=None, seed: int = 0):
    """The model on the CPU from ``seed`` (constant-initialized parameters perturbed), precision applied."""
    from models.quant.recipe import apply_precision

    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and not name.endswith(("dt_bias", "A_log", "conv1d.bias")):
                param.add_(0.1 * torch.randn_like(param))
    if precision is not None:
        apply_precision(model, precision, device=torch.device("cpu"))
    return model


def tp_mesh(world: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh

    if world == tp:
        return init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))["tp"]
    return init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp_shard", "tp"))["tp"]


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).norm() / reference.norm()).item()


# ----------------------------------------------------------------------------------------------
# One process


class _Mesh:
    def __init__(self, rank, size):
        self.rank, self.n = rank, size

    def get_local_rank(self):
        return self.rank

    def size(self):
        return self.n


def test_the_vocab_parallel_embedding_refuses_a_sequence_tp_does_not_divide():
    from trainer.tensor_parallel import VocabParallelEmbedding

    class Group:
        def size(self):
            return 3

    embedding = torch.nn.Embedding(12, 4)
    embedding.__class__ = VocabParallelEmbedding
    embedding.tp_rank, embedding.tp_group = 0, Group()
    with pytest.raises(ValueError, match="sequence length 8 is not divisible by tp=3"):
        embedding(torch.zeros(2, 8, dtype=torch.long))


def test_stochastic_rounding_seed_mixes_in_the_tp_rank():
    from models.quant.gemm_spec import nvfp4_linear_spec
    from models.quant.linear import QuantLinear

    assert mix_seed(7, 3, 11, 2, 1, tp_rank=0) == mix_seed(7, 3, 11, 2, 1)  # unchanged without TP
    seeds = []
    for tp_rank in (0, 1):
        layer = QuantLinear(32, 32, bias=False, spec=nvfp4_linear_spec())
        layer.set_seed(5, layer=2)
        layer.set_tensor_parallel("column", None, tp_rank)
        layer.set_step(9, rank=0)
        seeds.append(layer.sr_seed.item())
    assert seeds[0] != seeds[1]
    with pytest.raises(ValueError, match="role must be one of"):
        QuantizedLinear(16, 16).set_tensor_parallel("diagonal", None, 0)


# ----------------------------------------------------------------------------------------------
# Two processes: the model


def _model_worker(rank: int, world: int, recipe: str, negative_control: bool) -> None:
    from torch.distributed.tensor.debug import CommDebugMode

    from trainer.tensor_parallel import apply_tensor_parallel, cross_entropy, reduce_tp_replicated_grads

    mesh = tp_mesh(world, world)
    precision = None if recipe == "bf16" else precision_config(
        recipe, bf16_layers_at_start=0, bf16_layers_at_end=0, gradient_stochastic_rounding=False, backend="emulated")
    cfg = tp_config()
    if precision is not None:  # the tiny config's in_proj shard (168 rows) cuts NVFP4 blocks: refused, unchanged
        unaligned = build(load_model_config("tiny"), precision)
        with pytest.raises(ValueError, match=r"layers\.0\.mixer\.in_proj.*out_features 336 into 2 shards of 168"):
            apply_tensor_parallel(unaligned, mesh)
        assert getattr(unaligned, "tensor_parallel", None) is None
    reference, model = build(cfg, precision), build(cfg, precision)
    info = apply_tensor_parallel(model, mesh)
    assert info["column_parallel_linears"] == 8 and info["row_parallel_linears"] == 6
    assert info["sharded_vectors"] == 3 * 6 and info["replicated_parameters"] == 6 + 1  # block norms, norm_f
    assert info["vocab_parallel_embeddings"] == info["vocab_parallel_lm_heads"] == 1
    assert info["quantized_sharded_linears"] == (0 if precision is None else 14)
    if negative_control:
        for module in model.modules():
            if isinstance(module, QuantizedLinear):
                module.amax_reduction = None

    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size, (2, 64), generator=generator)
    labels = torch.randint(0, cfg.vocab_size, (2, 64), generator=generator)
    reference_logits = reference(ids)
    F.cross_entropy(reference_logits.flatten(0, 1), labels.flatten()).backward()

    with CommDebugMode() as forward_comms:
        logits = model(ids)
    loss = cross_entropy(logits, labels, mesh)  # the batch's, the same on both ranks
    with CommDebugMode() as backward_comms:
        loss.backward()
    assert reduce_tp_replicated_grads(model) == info["replicated_parameters"]

    expected = info["collectives_per_micro_batch"]
    # Per mixer a gather and a scatter each way; the embedding's scatter forward, its gather backward; the LM
    # head's gather forward, its scatter backward.
    for counted, phase, gathers, scatters in ((forward_comms, "forward", 7, 7), (backward_comms, "backward", 7, 7)):
        counts = {str(op).split(".")[-1]: n for op, n in counted.get_comm_counts().items()}
        assert counts.get("all_gather_into_tensor", 0) == expected[phase]["all_gather"] == gathers
        assert counts.get("reduce_scatter_tensor", 0) == expected[phase]["reduce_scatter"] == scatters
        assert counts.get("all_reduce", 0) == (0 if negative_control else expected[phase]["amax_all_reduce"])

    columns = cfg.vocab_size // world
    ours, theirs = logits.detach(), reference_logits.detach()[..., rank * columns:(rank + 1) * columns]
    assert ours.shape == (2, 64, columns)
    errors = {}
    for (name, param), reference_param in zip(model.named_parameters(), reference.parameters()):
        errors[name] = relative_error(param.grad.full_tensor(), reference_param.grad)
    reference_loss = F.cross_entropy(reference_logits.flatten(0, 1), labels.flatten())
    if precision is None:
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * theirs.abs().max().item())
        assert loss.item() == pytest.approx(reference_loss.item(), rel=1e-6)
        assert max(errors.values()) < 1e-5, errors
        return
    total = loss.detach()
    moved = (ours - theirs).abs() > 1e-5
    moved_share = torch.tensor([moved.float().mean().item()])
    dist.all_reduce(moved_share)
    moved_share = moved_share.item() / world
    if negative_control:
        assert moved_share > 0.9 and min(errors.values()) > 0.2, (moved_share, errors)
        return
    assert abs(total.item() - reference_loss.item()) < 1e-3 * reference_loss.item()
    assert moved_share < 0.05, moved_share  # a rounding flip moves one token's logits
    assert max(errors.values()) < 0.2, errors


@pytest.mark.distributed
@pytest.mark.parametrize("recipe, negative_control", [("bf16", False), ("nvfp4", False), ("nvfp4", True)],
                         ids=["bf16", "nvfp4", "nvfp4-without-amax-reduction"])
def test_two_ranks_compute_what_one_process_computes(recipe, negative_control):
    run_ranks(_model_worker, 2, recipe, negative_control)


def _collectives_worker(rank: int, world: int) -> None:
    from trainer.tensor_parallel import gather_sequence, reduce_scatter_sequence

    group = dist.group.WORLD
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3).add(100 * rank).requires_grad_(True)
    gathered = gather_sequence(hidden, group)
    assert torch.equal(gathered[:, 4 * rank: 4 * rank + 4], hidden)
    out = reduce_scatter_sequence(gathered * 2, group)  # every rank holds the same gathered tensor
    assert torch.equal(out, hidden * 2 * world)
    out.sum().backward()  # an expanded (stride 0) gradient: the collectives take it contiguous
    assert torch.equal(hidden.grad, torch.full_like(hidden, 2.0 * world))


@pytest.mark.distributed
def test_sequence_collectives_and_their_gradients():
    run_ranks(_collectives_worker, 2)


def _cross_entropy_worker(rank: int, world: int) -> None:
    from trainer.tensor_parallel import cross_entropy

    mesh = tp_mesh(world, world)
    generator = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(2, 16, 40, generator=generator)).requires_grad_(True)  # every rank the same
    labels = torch.randint(0, 40, (2, 16), generator=generator)
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    expected.backward()
    columns = 40 // world
    mine = logits.detach()[..., rank * columns:(rank + 1) * columns].clone().requires_grad_(True)
    loss = cross_entropy(mine, labels, mesh)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(mine.grad, logits.grad[..., rank * columns:(rank + 1) * columns], rtol=1e-5, atol=1e-7)


@pytest.mark.distributed
def test_the_vocab_parallel_loss_is_the_loss_of_the_whole_logits():
    """Each rank holds 20 of 40 vocabulary columns: the loss is F.cross_entropy's of the whole logits, and each
    rank's gradient is its columns of the whole gradient."""
    run_ranks(_cross_entropy_worker, 2)


# ----------------------------------------------------------------------------------------------
# Two processes: the quantized operands of one sharded layer


def _record_operands(monkeypatch_target, records: dict):
    """Wrap linear._quantize_operand: name -> (values fp32, decode) of every operand quantized."""
    from models.quant import linear

    original = linear._quantize_operand

    def recording(tensor, spec, **kwargs):
        operand = original(tensor, spec, **kwargs)
        records[kwargs["name"]] = (operand.values.float().clone(), operand.decode)
        return operand

    monkeypatch_target.append((linear, original))
    linear._quantize_operand = recording


def _run_layer(weight, x, dy, spec, tp=None):
    """Forward and backward of a QuantLinear holding ``weight``; its operands by name."""
    from models.quant import linear

    layer = linear.QuantLinear(weight.shape[1], weight.shape[0], bias=False, spec=spec, name="layer")
    with torch.no_grad():
        layer.weight.copy_(weight)
    if tp is not None:
        layer.set_tensor_parallel(*tp)
    records, restore = {}, []
    _record_operands(restore, records)
    try:
        x = x.clone().requires_grad_(True)
        layer(x).backward(dy)
    finally:
        for module, original in restore:
            module._quantize_operand = original
    return records


def _assert_slice(records, full, name, rows=slice(None), cols=slice(None)):
    values, decode = records[name]
    full_values, full_decode = full[name]
    assert torch.equal(values, full_values[rows, cols]), name
    assert (decode is None and full_decode is None) or torch.equal(decode, full_decode), name


def _operands_worker(rank: int, world: int) -> None:
    from models.quant import fp8_torch
    from models.quant.gemm_spec import OperandSpec, fp8_tensor_linear_spec, nvfp4_linear_spec

    group = dist.group.WORLD
    generator = torch.Generator().manual_seed(3)
    x, weight, dy = (torch.randn(shape, generator=generator) for shape in ((32, 64), (64, 64), (32, 64)))
    # The tensors' maxima sit in rank 1's shards (output column 50, input column 40): rank 0's own amax is smaller.
    weight[50, 40], x[:, 40], dy[:, 50] = 9.0, 7.0, 5.0
    share = slice(rank * 32, (rank + 1) * 32)
    specs = {"nvfp4": nvfp4_linear_spec(stochastic_rounding=False),
             "nvfp4_weight_1d": nvfp4_linear_spec(stochastic_rounding=False, weight_2d=False),
             "nvfp4_four_over_six": nvfp4_linear_spec(stochastic_rounding=False, four_over_six=("x", "w", "dy")),
             "fp8_tensor": fp8_tensor_linear_spec()}
    for (label, spec), dtype in ((item, dtype) for item in specs.items() for dtype in (torch.float32, torch.bfloat16)):
        # fp32 compute: the operands fully dequantized; bf16: the scaled values and the decode scale apart.
        x, dy = x.to(dtype), dy.to(dtype)
        full = _run_layer(weight, x, dy, spec)
        column = _run_layer(weight[share], x, dy[:, share], spec, ("column", group, rank))
        for name, rows, cols in (("Fprop X", slice(None), slice(None)), ("Fprop W", share, slice(None)),
                                 ("Dgrad dY", slice(None), share), ("Wgrad dY^T", share, slice(None)),
                                 ("Wgrad X^T", slice(None), slice(None))):
            _assert_slice(column, full, name, rows, cols)
        row = _run_layer(weight[:, share], x[:, share], dy, spec, ("row", group, rank))
        for name, rows, cols in (("Fprop X", slice(None), share), ("Fprop W", slice(None), share),
                                 ("Dgrad dY", slice(None), slice(None)), ("Wgrad dY^T", slice(None), slice(None)),
                                 ("Wgrad X^T", share, slice(None))):
            _assert_slice(row, full, name, rows, cols)
        if "Dgrad W^T" in full:  # re-quantized from W (1x16 along N), not Fprop's W reused
            _assert_slice(column, full, "Dgrad W^T", slice(None), share)
            _assert_slice(row, full, "Dgrad W^T", share, slice(None))
        if rank == 0 and label == "nvfp4":  # the control: without the reduction rank 0's W quantizes otherwise
            alone = _run_layer(weight[share], x, dy[:, share], spec)
            assert not torch.equal(alone["Fprop W"][0], full["Fprop W"][0][share])
    # The native FP8 backend's per-tensor quantizer takes the group's amax too (codes and decode scale).
    tensor_spec = OperandSpec("fp8_tensor")
    whole, _ = fp8_torch.quantize_operands(weight, tensor_spec, None)
    mine, mine_t = fp8_torch.quantize_operands(weight[share], tensor_spec, tensor_spec, amax_group=group)
    assert torch.equal(mine.data.view(torch.uint8), whole.data[share].view(torch.uint8))
    assert torch.equal(mine_t.data.view(torch.uint8), whole.data[share].t().contiguous().view(torch.uint8))
    assert torch.equal(mine.scale, whole.scale)


@pytest.mark.distributed
def test_sharded_quantized_operands_are_slices_of_the_unsharded_ones():
    run_ranks(_operands_worker, 2)
