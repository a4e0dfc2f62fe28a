"""The native NVFP4 layer under tensor parallelism (two gloo ranks on the CPU): each rank's quantized operands,
taken with the group's amax, are the slices of the unsharded layer's operands (codes, block scales and decode
scale), as the emulated layer's are (test_tensor_parallel.py). The GEMM itself needs a Blackwell GPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from test_tensor_parallel import run_ranks


def _operands_worker(rank: int, world: int) -> None:
    from models.quant import nvfp4_torch
    from models.quant.gemm_spec import OperandSpec
    from models.quant.quantized_linear import TP_AMAX_OPERANDS, AmaxReduction

    group = dist.group.WORLD
    generator = torch.Generator().manual_seed(5)
    x, weight, dy = (torch.randn(shape, generator=generator) for shape in ((48, 64), (64, 64), (48, 64)))
    # The maxima sit in rank 1's shards (output row 50, input column 40): rank 0's own amax is smaller.
    weight[50, 40], x[:, 40], dy[:, 50] = 9.0, 7.0, 5.0
    share = slice(rank * 32, (rank + 1) * 32)
    blocks = slice(share.start // 16, share.stop // 16)
    tile, vector = OperandSpec("nvfp4", (16, 16)), OperandSpec("nvfp4", (1, 16))
    along_tokens = OperandSpec("nvfp4", (1, 16), rht=True)
    reductions = {role: AmaxReduction(group, TP_AMAX_OPERANDS[role]) for role in TP_AMAX_OPERANDS}

    def operand(tensor, spec, transpose, name, role=None):
        amax = reductions[role] if role else None
        return nvfp4_torch.quantize_operand(tensor, spec, transpose=transpose, name=name, amax=amax).operand()

    def assert_slice(mine, whole, rows, columns, what):
        columns_of_scales = columns if columns == slice(None) else blocks
        assert torch.equal(mine.codes(), whole.codes()[rows, columns]), f"{what}: codes"
        assert torch.equal(mine.block_scales().view(torch.uint8),
                           whole.block_scales().view(torch.uint8)[rows, columns_of_scales]), f"{what}: scales"
        assert torch.equal(mine.decode, whole.decode), f"{what}: decode scale"

    everything = slice(None)
    # Column-parallel: W [N/tp, K] and the output's gradient dY [T, N/tp] are the rank's.
    for spec in (tile, vector):
        assert_slice(operand(weight[share], spec, False, "Fprop W", "column"), operand(weight, spec, False, "Fprop W"),
                     share, everything, f"column Fprop W {spec.describe()}")
    assert_slice(operand(weight[share], vector, True, "Dgrad W^T", "column"),
                 operand(weight, vector, True, "Dgrad W^T"), everything, share, "column Dgrad W^T (1x16 along N)")
    assert_slice(operand(dy[:, share], vector, False, "Dgrad dY", "column"), operand(dy, vector, False, "Dgrad dY"),
                 everything, share, "column Dgrad dY")
    assert_slice(operand(dy[:, share], along_tokens, True, "Wgrad dY^T", "column"),
                 operand(dy, along_tokens, True, "Wgrad dY^T"), share, everything, "column Wgrad dY^T")
    # Row-parallel: W [N, K/tp] and the input X [T, K/tp] are the rank's.
    assert_slice(operand(x[:, share], vector, False, "Fprop X", "row"), operand(x, vector, False, "Fprop X"),
                 everything, share, "row Fprop X")
    assert_slice(operand(weight[:, share], tile, False, "Fprop W", "row"), operand(weight, tile, False, "Fprop W"),
                 everything, share, "row Fprop W")
    assert_slice(operand(x[:, share], along_tokens, True, "Wgrad X^T", "row"),
                 operand(x, along_tokens, True, "Wgrad X^T"), share, everything, "row Wgrad X^T")
    if rank == 0:  # the control: without the group's amax rank 0's W quantizes otherwise
        alone = operand(weight[share], tile, False, "Fprop W")
        assert not torch.equal(alone.decode, operand(weight, tile, False, "Fprop W").decode)


@pytest.mark.distributed
def test_sharded_native_nvfp4_operands_are_slices_of_the_unsharded_ones():
    run_ranks(_operands_worker, 2)


def _layer_worker(rank: int, world: int) -> None:
    """The layer sharded in each role, its GEMM computed from the packed operands, against the emulated layer
    sharded alike: the amax reduction reaches every operand (a rank whose own amax were taken would quantize
    otherwise, far beyond the tolerance)."""
    import torch.nn as nn

    from models.quant import nvfp4_torch
    from models.quant.gemm_spec import nvfp4_linear_spec
    from models.quant.linear import QuantLinear

    nvfp4_torch.nvfp4_gemm = lambda a, b, out_dtype: (a.dequantize() @ b.dequantize().t()).to(out_dtype)
    nvfp4_torch.check_native_support = lambda *args, **kwargs: None
    group = dist.group.WORLD
    generator = torch.Generator().manual_seed(9)
    x, weight, dy = (torch.randn(shape, generator=generator) for shape in ((64, 64), (64, 64), (64, 64)))
    weight[50, 40], x[:, 40], dy[:, 50] = 9.0, 7.0, 5.0  # the maxima in rank 1's shards
    share = slice(rank * 32, (rank + 1) * 32)
    for role, w, inputs, grads in (("column", weight[share], x, dy[:, share]),
                                   ("row", weight[:, share], x[:, share], dy)):
        outputs = []
        for linear_class in (nvfp4_torch.TorchNvfp4Linear, QuantLinear):
            layer = linear_class.from_linear(nn.Linear(w.shape[1], w.shape[0], bias=False), nvfp4_linear_spec(),
                                             name="layer")
            with torch.no_grad():
                layer.weight.copy_(w)
            layer.set_tensor_parallel(role, group, rank)
            layer.set_seed(3, layer=1)
            layer.set_step(2)
            xi = inputs.clone().requires_grad_(True)
            y = layer(xi)
            y.backward(grads)
            outputs.append((y.detach(), xi.grad, layer.weight.grad))
        for name, got, want in zip(("Y", "dX", "dW"), *outputs):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item()), f"{role} {name}"


@pytest.mark.distributed
def test_the_sharded_native_nvfp4_layer_is_the_sharded_emulated_layer():
    run_ranks(_layer_worker, 2)


def _gather_worker(rank: int, world: int) -> None:
    """The tiny hybrid in native NVFP4 (the GEMM computed from the packed operands) at tp=2, round-to-nearest:
    with the mixers' one column-parallel linear gathering its input quantized (Mamba's in_proj, the MLP's
    up_proj) and every row-parallel linear reduce-scattering its output and gathering dY quantized, the model
    computes, bit for bit, what it computes when every gather moves high-precision values: the gathered codes
    and scales (X forward; X^T, dY and dY^T backward) are those of the gathered tensors. Without the group's
    amax for X the logits move (the control); with the blocks traced by Dynamo they do not (the gradients to
    summation order). Switched late to BF16, the layers still gather and scatter the sequence themselves and
    compute what the BF16 gathers around them do."""
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    import models.quant.recipe as recipe
    import trainer.tensor_parallel as tensor_parallel
    from models.quant import nvfp4_torch
    from models.quant.quantized_linear import TP_AMAX_OPERANDS, AmaxReduction
    from test_tensor_parallel import build, precision_config, tp_config, tp_mesh
    from torch._dynamo.utils import counters

    from trainer.compile import apply_compile, compile_fallbacks

    nvfp4_torch.nvfp4_gemm = lambda a, b, out_dtype: (a.dequantize() @ b.dequantize().t()).to(out_dtype)
    nvfp4_torch.check_native_support = lambda *args, **kwargs: None
    recipe.resolve_backend = lambda *args, **kwargs: "torch"
    mesh = tp_mesh(world, world)
    precision = precision_config("nvfp4", bf16_layers_at_start=0, bf16_layers_at_end=0,
                                 gradient_stochastic_rounding=False, backend="torch")
    cfg = tp_config()
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size, (2, 64), generator=generator)
    labels = torch.randint(0, cfg.vocab_size, (2, 64), generator=generator)
    original, original_scatterer = tensor_parallel.quantized_input_gatherer, tensor_parallel.quantized_output_scatterer
    traced = []

    def run(gathers: bool, control: bool = False, compiled: bool = False, switched: bool = False):
        model = build(cfg, precision)
        assert isinstance(model.layers[0].mixer.in_proj, nvfp4_torch.TorchNvfp4Linear)
        if not gathers:
            tensor_parallel.quantized_input_gatherer = tensor_parallel.quantized_output_scatterer = lambda block: None
        try:
            info = tensor_parallel.apply_tensor_parallel(model, mesh)
        finally:
            tensor_parallel.quantized_input_gatherer = original
            tensor_parallel.quantized_output_scatterer = original_scatterer
        if switched:  # the late switch to BF16 of every GEMM: the gatherers and scatterers still move the sequence
            for module in model.modules():
                if isinstance(module, nvfp4_torch.TorchNvfp4Linear):
                    module.set_high_precision()
        if control:  # the gathered X quantized with each rank's own amax
            for block in model.layers:
                layer = original(block)
                if layer is not None:
                    layer.amax_reduction = AmaxReduction(layer.amax_reduction.group, TP_AMAX_OPERANDS["column"])
        if compiled:  # Dynamo traces the blocks, the quantized gathers inside them (no code generation)
            apply_compile(model, backend=lambda graph, inputs: traced.append(graph) or graph.forward)
        # Counted eagerly: Dynamo does not trace under a dispatch mode such as CommDebugMode.
        counting = contextlib.nullcontext if compiled else CommDebugMode
        with counting() as forward_comms:
            logits = model(ids)
        loss = tensor_parallel.cross_entropy(logits, labels, mesh)
        with counting() as backward_comms:
            loss.backward()
        tensor_parallel.reduce_tp_replicated_grads(model)
        grads = {name: param.grad.to_local() for name, param in model.named_parameters()}
        return info, (forward_comms, backward_comms), logits.detach(), grads

    info, comms, logits, grads = run(gathers=True)
    assert info["quantized_input_gathers"] == 5  # M-M*M-: three in_proj, two up_proj; attention gathers first
    assert info["quantized_output_scatters"] == 6  # every mixer's row-parallel linear
    assert info["reduce_scatters_per_sequence"] == 6  # each scatterer's forward, a sequence at a time
    for counted, phase in zip(comms, ("forward", "backward")):
        counts = {str(op).split(".")[-1]: n for op, n in counted.get_comm_counts().items()}
        expected = info["collectives_per_micro_batch"][phase]
        # forward: the embedding's, the attention's; backward: + each gatherer's X^T, each scatterer's dY^T
        assert counts.get("all_gather_into_tensor", 0) == expected["all_gather"] == 7 + (5 + 6) * (phase == "backward")
        pieces = ids.shape[0] * info["reduce_scatters_per_sequence"] if phase == "forward" else 0
        assert counts.get("reduce_scatter_tensor", 0) == expected["reduce_scatter"] + pieces == 7 + 6 * (phase == "forward")
        assert counts.get("all_reduce", 0) == expected["amax_all_reduce"]
    info_hp, _, logits_hp, grads_hp = run(gathers=False)
    assert info_hp["quantized_input_gathers"] == info_hp["quantized_output_scatters"] == 0
    # The gatherers' X and X^T and the scatterers' dY and dY^T join their phase's one amax all-reduce: a
    # quantized linear's forward and backward take one each either way.
    amaxes, amaxes_hp = (counts["collectives_per_micro_batch"] for counts in (info, info_hp))
    for phase in ("forward", "backward"):
        assert amaxes[phase]["amax_all_reduce"] == amaxes_hp[phase]["amax_all_reduce"] == info["quantized_sharded_linears"]
    assert torch.equal(logits, logits_hp)
    for name, grad in grads.items():
        assert torch.equal(grad, grads_hp[name]), name
    _, _, logits_control, _ = run(gathers=True, control=True)
    assert not torch.equal(logits_control, logits)
    _, _, logits_switched, grads_switched = run(gathers=True, switched=True)
    _, _, logits_switched_hp, grads_switched_hp = run(gathers=False, switched=True)
    assert not torch.equal(logits_switched, logits)  # BF16 GEMMs now
    torch.testing.assert_close(logits_switched, logits_switched_hp)
    for name, grad in grads_switched.items():
        torch.testing.assert_close(grad, grads_switched_hp[name], msg=name)
    _, _, logits_compiled, grads_compiled = run(gathers=True, compiled=True)
    assert compile_fallbacks() == [] and dict(counters["graph_break"]) == {}
    assert len(traced) >= 3  # one graph per mixer kind at least (blocks of a kind share theirs)
    assert torch.equal(logits_compiled, logits)
    for name, grad in grads.items():  # the traced backward may sum in another order (the embedding's, 1e-6)
        torch.testing.assert_close(grads_compiled[name], grad, rtol=0, atol=1e-5 * grad.abs().max().item())


@pytest.mark.distributed
def test_quantized_sequence_gathers_compute_what_high_precision_gathers_do():
    run_ranks(_gather_worker, 2)
