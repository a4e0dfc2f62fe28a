"""Context parallelism (models/context_parallel.py, trainer/context_parallel.py) against one process.

One process: the SSD state passing alone (fp64): pieces of one sequence, each scanned from zero by
models.ssd.ssd_chunked and corrected by the entering state, equal the whole sequence's scan, outputs and every
input's gradient, also for pieces that are no multiple of the chunk size (ssd_chunked pads its last chunk, so any
piece length works); the three autograd Functions pass gradcheck; in bf16 (matmuls in bf16, fp32 accumulation)
the pieces' error against the fp64 whole scan stays within twice the unsplit bf16 scan's; the refusals (a length
cp does not divide, a piece shorter than the conv's halo).

gloo processes (``run_ranks``), the tiny hybrid (M-M*M-) in fp32, BF16 recipe (no quantization), the same
weights on every rank, each rank the contiguous piece of every sequence: cp=2 (L=64, pieces of 32: two
chunks) and cp=4 (L=40, pieces of 10: less than a chunk), and cp=2 x tp=2 (tensor-parallel heads):
- the logits of the rank's tokens equal the one-process model's (atol 1e-5 x the largest logit);
- every parameter's gradient summed over the cp ranks equals the one-process gradient of the summed token
  losses (relative error of the norm < 1e-5; the tensor-parallel case: the mean loss);
- the collectives counted (CommDebugMode) are exactly the all-gathers forward and reduce-scatters backward
  apply_context_parallel reports, with the message shapes and dtypes context_parallel_collectives lists
  (forward in issue order, backward in reverse order, recorded from the functional collectives' inputs);
- controls: without the state passing, the halo or the gathered K/V, rank 0's logits stay equal and every
  other rank's move (so each of the three ops is needed, and the comparison can fail).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import gradcheck
from torch.utils._python_dispatch import TorchDispatchMode

from models.config import load_model_config
from models.context_parallel import conv_with_halo, entering_state, piece_end_state, state_correction
from models.kernels.causal_conv import causal_conv1d_silu_conv1d
from models.ssd import discretize_dt, ssd_chunked
from tests.trainer.test_tensor_parallel import build, relative_error, run_ranks, tp_config
from trainer.context_parallel import check_local_length, context_parallel_collectives, context_parallel_slice

# ----------------------------------------------------------------------------------------------
# One process


def _ssd_inputs(length: int, dtype=torch.float64, slow: bool = False):
    """A random head-grouped SSD input (b 2, H 4, P 3, G 2, N 5), made in fp64 and rounded to ``dtype`` (A, D,
    dt_bias stay fp64, the model's fp32 parameters' stand-ins). ``slow``: decays that carry a state across a
    whole piece (dt ~ 0.05, |A| < 0.5), so the entering state matters on every token."""
    generator = torch.Generator().manual_seed(7)
    batch, heads, head_dim, groups, state = 2, 4, 3, 2, 5

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    x, dt_raw = randn(batch, length, heads, head_dim), randn(batch, length, heads)
    B, C = randn(batch, length, groups, state), randn(batch, length, groups, state)
    A = -(0.5 if slow else 4) * torch.rand(heads, generator=generator, dtype=torch.float64)
    D, dt_bias = randn(heads), randn(heads) - (3 if slow else 0)
    inputs = dict(x=x.to(dtype), dt=dt_raw.to(dtype), A=A, B=B.to(dtype), C=C.to(dtype), D=D, dt_bias=dt_bias)
    return {name: tensor.requires_grad_() for name, tensor in inputs.items()}


def _scan_whole(inputs, chunk: int = 8):
    return ssd_chunked(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], chunk, D=inputs["D"],
                       dt_bias=inputs["dt_bias"], dt_min=0.01)


def _scan_pieces(inputs, lengths, correct: bool = True, chunk: int = 8):
    """The inputs scanned piece by piece (ssd_chunked from zero), each piece corrected by the state entering it:
    its end state and log decay (piece_end_state), stacked as the all-gather stacks them, folded for each piece
    (entering_state) and added (state_correction). ``correct=False``: the zero-started scans alone."""
    x, dt, A, B, C, D, dt_bias = (inputs[name] for name in ("x", "dt", "A", "B", "C", "D", "dt_bias"))
    edges = torch.tensor([0, *lengths]).cumsum(0).tolist()
    pieces = [slice(start, end) for start, end in zip(edges[:-1], edges[1:])]
    scans = [ssd_chunked(x[:, piece], dt[:, piece], A, B[:, piece], C[:, piece], chunk, D=D, dt_bias=dt_bias,
                         dt_min=0.01) for piece in pieces]
    if not correct:
        return torch.cat(scans, 1)
    ends = [piece_end_state(x[:, piece], dt[:, piece], A, B[:, piece], dt_bias, dt_min=0.01) for piece in pieces]
    states, log_decays = torch.stack([s for s, _ in ends]), torch.stack([l for _, l in ends])
    assert states.dtype == log_decays.dtype == (torch.float64 if x.dtype == torch.float64 else torch.float32)
    pieced = []
    for rank, (y, piece) in enumerate(zip(scans, pieces)):
        entering = entering_state(states, log_decays, rank)
        assert entering.shape == states.shape[1:] and (rank > 0 or not entering.any())
        pieced.append(state_correction(y, dt[:, piece], A, C[:, piece], entering, dt_bias, dt_min=0.01))
    return torch.cat(pieced, 1)


def _grads(output, inputs, cotangent):
    return dict(zip(inputs, torch.autograd.grad(output, list(inputs.values()), cotangent)))


@pytest.mark.parametrize("lengths", [(16, 16, 16, 16), (13, 7, 20, 1), (40,)], ids=["whole-chunks", "ragged", "one"])
def test_state_passing_across_pieces_equals_the_whole_scan(lengths):
    inputs = _ssd_inputs(sum(lengths))
    whole, pieced = _scan_whole(inputs), _scan_pieces(inputs, lengths)
    assert pieced.dtype == torch.float64
    torch.testing.assert_close(pieced, whole, rtol=0, atol=1e-12 * whole.abs().max().item())
    cotangent = torch.randn(whole.shape, generator=torch.Generator().manual_seed(3), dtype=whole.dtype)
    expected, got = _grads(whole, inputs, cotangent), _grads(pieced, inputs, cotangent)
    for name in inputs:  # every input's gradient through the three Functions' backward
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-11 * expected[name].abs().max().item(),
                                   msg=lambda message: f"{name}: {message}")
    if len(lengths) > 1:  # the control: the zero-started scans alone are wrong after the first piece
        with torch.no_grad():
            uncorrected = _scan_pieces(inputs, lengths, correct=False)
        assert (uncorrected - whole)[:, lengths[0]:].abs().max() > 1e-2 * whole.abs().max()


def test_the_state_passing_functions_pass_gradcheck():
    """The three custom autograd Functions' backward against finite differences (fp64): with dt_bias and a
    dt_min that clamps some of the steps, without both, and the fold for every rank of 4 pieces."""
    inputs = _ssd_inputs(6)
    x, dt, A, B, C, dt_bias = (inputs[name].detach().requires_grad_() for name in ("x", "dt", "A", "B", "C", "dt_bias"))
    assert 0 < (discretize_dt(dt, dt_bias) < 0.3).sum() < dt.numel()  # the clamp acts on some steps, not all
    y = torch.randn(x.shape, dtype=x.dtype).requires_grad_()
    entering = torch.randn(x.shape[0], x.shape[2], x.shape[3], B.shape[-1], dtype=x.dtype).requires_grad_()
    assert gradcheck(lambda *a: piece_end_state(*a, dt_min=0.3), (x, dt, A, B, dt_bias))
    assert gradcheck(lambda *a: piece_end_state(*a, dt_softplus=False), (x, dt.detach().exp().requires_grad_(), A, B))
    assert gradcheck(lambda *a: state_correction(*a, dt_min=0.3), (y, dt, A, C, entering, dt_bias))
    assert gradcheck(lambda *a: state_correction(*a, dt_softplus=False), (y, dt.detach().exp().requires_grad_(), A, C,
                                                                        entering))
    states = torch.randn(4, *entering.shape, dtype=x.dtype).requires_grad_()
    log_decays = -torch.rand(4, *entering.shape[:2], dtype=x.dtype)
    for rank in range(4):
        assert gradcheck(lambda s, l: entering_state(s, l, rank), (states, log_decays.requires_grad_()))


def test_bf16_pieces_err_no_more_than_the_unsplit_bf16_scan():
    """bf16 x, dt, B, C, four pieces of 64 with slow decays (the entering state moves every token), against the
    fp64 whole scan of the same (rounded) inputs. The correction's matmuls run in bf16 with fp32 products and
    sums (a GPU's fp32 accumulation), states and decays in fp32. The pieces' largest output error is within twice
    the unsplit bf16 ssd_chunked's own (measured 0.0254 against 0.0156, 1.6x; the uncorrected pieces: 1.8 of a
    largest output of 8.2). Each input's gradient (a random cotangent) errs by at most 2^-7 of its largest value
    (measured at most 4.9e-3, dt's, and A's 7.5e-4; the unsplit scan's at most 3.5e-3 and 2.9e-4: its torch
    scan runs in fp32 throughout, while here the end state's scaled x and h are rounded to bf16 once, as mamba_ssm's
    Triton scan rounds its scaled B and its states at every chunk)."""
    lengths = (64, 64, 64, 64)
    inputs = _ssd_inputs(sum(lengths), torch.bfloat16, slow=True)
    exact = {name: tensor.detach().double().requires_grad_() for name, tensor in inputs.items()}
    reference = _scan_whole(exact, chunk=16)
    unsplit, pieced = _scan_whole(inputs, chunk=16), _scan_pieces(inputs, lengths, chunk=16)
    assert unsplit.dtype == pieced.dtype == torch.bfloat16

    def error(result):
        return (result.double() - reference).abs().max().item()

    with torch.no_grad():
        uncorrected = error(_scan_pieces(inputs, lengths, correct=False, chunk=16))
    assert uncorrected > 0.1 * reference.abs().max()  # the entering state matters here
    assert error(pieced) <= 2 * error(unsplit), (error(pieced), error(unsplit))
    cotangent = torch.randn(reference.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = _grads(reference, exact, cotangent)
    got = _grads(pieced, inputs, cotangent.to(pieced.dtype))
    for name in inputs:
        relative = (got[name].double() - expected[name]).abs().max() / expected[name].abs().max()
        assert relative <= 2 ** -7, (name, relative.item())


def test_the_sequence_must_split_evenly_and_hold_the_halo():
    ids = torch.arange(20).reshape(2, 10)
    assert torch.equal(context_parallel_slice(ids, 1, 2), ids[:, 5:])
    with pytest.raises(ValueError, match="sequence length 10 is not divisible by cp=4"):
        context_parallel_slice(ids, 0, 4)
    with pytest.raises(ValueError, match=r"piece of 8 / 4 = 2 tokens is shorter than the conv's K-1 = 3"):
        check_local_length(8, 4, min_local_tokens=3)
    fake = SimpleNamespace(group=None, rank=1, size=8)  # refused before any collective
    with pytest.raises(ValueError, match="holds 2 tokens, fewer than the conv's K-1 = 3"):
        conv_with_halo(causal_conv1d_silu_conv1d, torch.zeros(1, 2, 6), torch.zeros(6, 4), torch.zeros(6), fake)


# ----------------------------------------------------------------------------------------------
# Several processes


class _Collectives(TorchDispatchMode):
    """(op, input shape, dtype) of every functional collective on the cp group (its waits left out)."""

    def __init__(self, group_name: str):
        super().__init__()
        self.group_name, self.calls = group_name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "_c10d_functional" and isinstance(args[-1], str) and args[-1] == self.group_name:
            self.calls.append((func._overloadpacket.__name__, tuple(args[0].shape), args[0].dtype))
        return func(*args, **(kwargs or {}))


def _comm_counts(mode) -> dict:
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def _controls(model, local_ids, reference_logits, rank):
    """Without each op in turn: rank 0 (which needs nothing from others) unchanged, the other ranks wrong."""
    from models import attention, mamba2

    def local_conv(conv, xBC, weight, bias, cp):
        return conv(xBC, weight, bias)

    def local_attention(q, k, v, cp, enable_gqa):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)

    for module, name, replacement in ((mamba2, "pass_ssd_states", lambda y, *args, **kwargs: y),
                                      (mamba2, "conv_with_halo", local_conv),
                                      (attention, "gathered_kv_attention", local_attention)):
        original = getattr(module, name)
        setattr(module, name, replacement)
        try:
            with torch.no_grad():
                moved = (model(local_ids) - reference_logits).abs().max().item()
        finally:
            setattr(module, name, original)
        scale = reference_logits.abs().max().item()
        assert (moved < 1e-5 * scale) if rank == 0 else (moved > 1e-3 * scale), (name, rank, moved)


def _model_worker(rank: int, world: int, cp: int, length: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from trainer.context_parallel import apply_context_parallel

    tp = world // cp
    cfg = load_model_config("tiny") if tp == 1 else tp_config()
    batch = 2
    reference, model = build(cfg), build(cfg)
    if tp == 1:  # a ProcessGroup at cp=4, a 1-D DeviceMesh at cp=2: both accepted
        cp_mesh = dist.group.WORLD if cp == 4 else init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    else:
        from trainer.tensor_parallel import apply_tensor_parallel

        mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
        apply_tensor_parallel(model, mesh["tp"])
        cp_mesh = mesh["cp"]
    # With the sequence length the attention mask is built here; without, in the first forward (which runs under
    # the dispatch modes below: the mask is built outside them).
    info = apply_context_parallel(model, cp_mesh, seq_len=length if tp > 1 else None)
    holder = model.layers[0].mixer.context_parallel
    cp_group, cp_rank = holder.group, holder.rank
    assert holder.size == cp and cp_rank == rank // tp and list(holder.masks) == ([length // cp] if tp > 1 else [])
    mamba, attention = cfg.pattern.count("M"), cfg.pattern.count("*")
    assert info == {"degree": cp, "forward_all_gathers": 2 * mamba + attention,
                    "backward_reduce_scatters": 2 * mamba + attention, "mamba_layers": mamba,
                    "attention_layers": attention, "min_local_tokens": cfg.conv_kernel - 1}

    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=generator)
    labels = torch.randint(0, cfg.vocab_size, (batch, length), generator=generator)
    reference_logits = reference(ids)
    F.cross_entropy(reference_logits.flatten(0, 1), labels.flatten(), reduction="sum" if tp == 1 else "mean").backward()
    local_ids, local_labels = (context_parallel_slice(t, cp_rank, cp) for t in (ids, labels))
    piece = slice(cp_rank * (length // cp), (cp_rank + 1) * (length // cp))

    recorder = _Collectives(cp_group.group_name)
    with CommDebugMode() as forward_comms, recorder:
        logits = model(local_ids)
    forward_calls, recorder.calls = recorder.calls, []
    if tp == 1:
        loss = F.cross_entropy(logits.flatten(0, 1), local_labels.flatten(), reduction="sum")
    else:  # the rank's vocabulary columns: the tp group's loss, the mean over this cp rank's tokens
        from trainer.tensor_parallel import cross_entropy, reduce_tp_replicated_grads

        loss = cross_entropy(logits, local_labels, mesh["tp"]) / cp  # the sum over cp ranks: the batch's mean
    with CommDebugMode() as backward_comms, recorder:
        loss.backward()
    backward_calls = recorder.calls

    expected = context_parallel_collectives(cfg, batch, length // cp, tp=tp)
    assert [(op, shape[1:], dtype) for op, shape, dtype in forward_calls] == [
        ("all_gather_into_tensor", message["shape"], torch.float32) for message in expected]
    assert [(op, shape, dtype) for op, shape, dtype in backward_calls] == [
        ("reduce_scatter_tensor", (cp, *message["shape"]), torch.float32) for message in reversed(expected)]
    if tp == 1:  # and nothing else communicates (under tp the tp group's collectives come on top)
        assert _comm_counts(forward_comms) == {"all_gather_into_tensor": info["forward_all_gathers"]}
        assert _comm_counts(backward_comms) == {"reduce_scatter_tensor": info["backward_reduce_scatters"]}

    if tp == 1:
        ours, theirs = logits.detach(), reference_logits.detach()[:, piece]
        grads = {name: param.grad for name, param in model.named_parameters()}
    else:
        columns = cfg.vocab_size // tp
        tp_rank = mesh["tp"].get_local_rank()
        ours = logits.detach()
        theirs = reference_logits.detach()[:, piece, tp_rank * columns:(tp_rank + 1) * columns]
        reduce_tp_replicated_grads(model)
        grads = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * theirs.abs().max().item())
    errors = {}
    for (name, grad), reference_param in zip(grads.items(), reference.parameters()):
        dist.all_reduce(grad, group=cp_group)  # each rank's tokens' share of the gradient
        errors[name] = relative_error(grad, reference_param.grad)
    assert max(errors.values()) < 1e-5, errors
    if tp == 1:
        _controls(model, local_ids, reference_logits.detach()[:, piece], cp_rank)


@pytest.mark.distributed
@pytest.mark.parametrize("world, cp, length", [(2, 2, 64), (4, 4, 40), (4, 2, 64)],
                         ids=["cp2", "cp4-pieces-under-a-chunk", "cp2-tp2"])
def test_context_parallel_computes_what_one_process_computes(world, cp, length):
    run_ranks(_model_worker, world, cp, length)


def test_the_collective_list_follows_the_pattern():
    cfg = dataclasses.replace(load_model_config("tiny"), pattern="M*-")
    messages = context_parallel_collectives(cfg, batch=3, local_tokens=32, tp=2)
    assert [m["what"] for m in messages] == ["conv_halo", "ssd_state", "attention_kv"]
    assert messages[0]["shape"] == (3, 3, (128 + 2 * 2 * 16) // 2)  # d + 2 G N conv channels, over tp
    assert messages[1]["shape"] == (3 * 8 * (8 * 16 + 1),) and messages[1]["dtype"] == "float32"
    assert messages[2]["shape"] == (2, 3, 1, 32, 16)
