"""GPU fast paths against their torch references (run on the GPU machine: ``pytest -m gpu tests/models``).

- mamba_ssm's Triton SSD (``ssd_backend='triton'``) vs models.ssd, forward and backward;
- mamba_ssm's Triton gated RMSNorm vs the torch reference, forward and backward;
- the torch.compile'd causal conv vs eager F.conv1d, forward and backward;
- the whole mixer with every fast path vs every torch path; the model's bf16 step on CUDA.

Tolerances are norm-relative (||a - b|| / ||b||): bf16 inputs round to 8 bits (~4e-3), and the
Triton SSD uses TF32 dots even on fp32 inputs (measured 1.5e-3 vs mamba_ssm's own reference).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from model_testing import make_model, randomize_trivial_params, tiny_config
from models.kernels import causal_conv, has_mamba_ssm_triton, mamba_ssm_triton
from models.mamba2 import Mamba2Mixer
from models.norms import gated_rms_norm_reference
from models.ssd import ssd_chunked

pytestmark = pytest.mark.gpu


@pytest.fixture
def triton_kernels():
    # Checked when a test runs, not at collection: loading mamba_ssm's modules registers a bare
    # `mamba_ssm` package, which transformers' NemotronH (imported at collection by test_hf)
    # must not see, or it would route its CPU fallbacks to Triton.
    if not has_mamba_ssm_triton():
        pytest.skip("mamba_ssm's Triton kernels not importable (see models/kernels/mamba_ssm_triton.py)")


needs_triton = pytest.mark.usefixtures("triton_kernels")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _ssd_inputs(dtype, batch=2, length=1000, heads=16, groups=4, head_dim=64, state=64):
    device = "cuda"
    return dict(
        x=torch.randn(batch, length, heads, head_dim, device=device, dtype=dtype),
        dt=(torch.randn(batch, length, heads, device=device) - 1.0).to(dtype),
        A_log=torch.empty(heads, device=device).uniform_(0.0, 2.77),
        B=torch.randn(batch, length, groups, state, device=device, dtype=dtype),
        C=torch.randn(batch, length, groups, state, device=device, dtype=dtype),
        D=torch.randn(heads, device=device),
        dt_bias=torch.randn(heads, device=device) * 0.5,
    )


def _run_ssd(backend, inputs, grad_out, chunk, clamp):
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    A = -torch.exp(leaves["A_log"])
    if backend == "triton":
        y = mamba_ssm_triton.chunk_scan(
            leaves["x"], leaves["dt"], A, leaves["B"], leaves["C"], chunk,
            D=leaves["D"], dt_bias=leaves["dt_bias"], dt_softplus=True, dt_limit=(clamp, float("inf")),
        )
    else:
        y = ssd_chunked(
            leaves["x"], leaves["dt"], A, leaves["B"], leaves["C"], chunk,
            D=leaves["D"], dt_bias=leaves["dt_bias"], dt_softplus=True, dt_min=clamp,
        )
    (y.float() * grad_out).sum().backward()
    return y.detach(), {k: v.grad for k, v in leaves.items()}


# Per-head parameter gradients (A_log, dt_bias, D) are sums over every token and channel with
# mixed signs, so they get a looser bound than the per-element ones.
PER_HEAD = ("A_log", "dt_bias", "D")


@needs_triton
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 5e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("clamp", [0.0, 0.01])
def test_triton_ssd_matches_torch_ssd(dtype, tol, clamp):
    inputs = _ssd_inputs(dtype)  # length 1000: a partial last chunk
    grad_out = torch.randn(inputs["x"].shape, device="cuda")
    y_tri, g_tri = _run_ssd("triton", inputs, grad_out, 64, clamp)
    y_ref, g_ref = _run_ssd("torch", inputs, grad_out, 64, clamp)
    assert y_tri.dtype == y_ref.dtype == dtype
    assert rel(y_tri, y_ref) < tol
    for name in inputs:
        bound = 2.5 * tol if name in PER_HEAD else tol
        assert rel(g_tri[name], g_ref[name]) < bound, f"grad of {name}: {rel(g_tri[name], g_ref[name])}"


@needs_triton
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_triton_gated_norm_matches_reference(dtype, tol):
    wide = torch.randn(2, 300, 1000, device="cuda", dtype=dtype)  # z: strided view, as in the mixer
    x = torch.randn(2, 300, 512, device="cuda", dtype=dtype)
    weight = 1 + 0.1 * torch.randn(512, device="cuda")
    grad_out = torch.randn(2, 300, 512, device="cuda")
    results = []
    for fn in ("triton", "torch"):
        w_leaf, x_leaf, wt = wide.clone().requires_grad_(True), x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        z = w_leaf[..., 100:612]
        if fn == "triton":
            y = mamba_ssm_triton.gated_rmsnorm(x_leaf, wt, None, z=z, eps=1e-5, group_size=128, norm_before_gate=False)
        else:
            y = gated_rms_norm_reference(x_leaf, z, wt, 128, 1e-5)
        (y.float() * grad_out).sum().backward()
        results.append((y.detach(), x_leaf.grad, w_leaf.grad, wt.grad))
    for got, ref, name in zip(results[0], results[1], ("y", "dx", "dz", "dweight")):
        assert rel(got, ref) < tol, f"{name}: {rel(got, ref)}"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_compiled_causal_conv_matches_conv1d(dtype, tol, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # exact fp32 reference
    wide = torch.randn(2, 777, 700, device="cuda", dtype=dtype)
    weight = torch.randn(640, 4, device="cuda", dtype=dtype) * 0.5
    bias = torch.randn(640, device="cuda", dtype=dtype) * 0.5
    grad_out = torch.randn(2, 777, 640, device="cuda")
    results = []
    for fn in (causal_conv.compiled_causal_conv1d_silu, causal_conv.causal_conv1d_silu_conv1d):
        w_leaf, wt, b = wide.clone().requires_grad_(True), weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        y = fn(w_leaf[..., 30:670], wt, b)
        (y.float() * grad_out).sum().backward()
        results.append((y.detach(), w_leaf.grad, wt.grad, b.grad))
    for got, ref, name in zip(results[0], results[1], ("y", "dx", "dweight", "dbias")):
        assert rel(got, ref) < tol, f"{name}: {rel(got, ref)}"


@needs_triton
def test_mixer_fast_paths_match_torch_paths_bf16():
    fast_cfg = tiny_config(
        hidden_size=256, mamba_num_heads=16, mamba_head_dim=32, ssm_state_size=32, chunk_size=64,
        ssd_backend="triton", gated_norm_backend="triton", conv_backend="compiled",
    )
    slow_cfg = dataclasses.replace(fast_cfg, ssd_backend="torch", gated_norm_backend="torch", conv_backend="conv1d")
    fast = Mamba2Mixer(fast_cfg).cuda()
    fast.init_weights(0.02)
    slow = Mamba2Mixer(slow_cfg).cuda()
    slow.load_state_dict(fast.state_dict())
    fast, slow = fast.bfloat16(), slow.bfloat16()
    x = torch.randn(2, 600, 256, device="cuda", dtype=torch.bfloat16)
    grad_out = torch.randn(2, 600, 256, device="cuda")
    outputs = []
    for mixer in (fast, slow):
        xl = x.clone().requires_grad_(True)
        y = mixer(xl)
        (y.float() * grad_out).sum().backward()
        outputs.append((y.detach(), xl.grad, {n: p.grad for n, p in mixer.named_parameters()}))
    assert rel(outputs[0][0], outputs[1][0]) < 2e-2
    assert rel(outputs[0][1], outputs[1][1]) < 2e-2
    for name, grad in outputs[0][2].items():
        bound = 5e-2 if name in PER_HEAD else 3e-2
        assert rel(grad, outputs[1][2][name]) < bound, f"{name}: {rel(grad, outputs[1][2][name])}"


def test_model_forward_backward_cuda_bf16():
    cfg = tiny_config(hidden_size=256, ffn_hidden_size=512, mamba_num_heads=16, mamba_head_dim=32, chunk_size=64)
    reference = make_model(dataclasses.replace(cfg, ssd_backend="torch", gated_norm_backend="torch"), seed=9)
    randomize_trivial_params(reference)
    model = make_model(cfg, seed=9, device="cuda")  # 'auto' backends: the fast paths on CUDA
    model.load_state_dict(reference.state_dict())
    model = model.bfloat16()
    ids = torch.randint(0, cfg.vocab_size, (2, 512))
    logits = model(ids.cuda())
    assert logits.dtype == torch.bfloat16
    loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].cuda().flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad():
        assert rel(logits.cpu(), reference(ids)) < 3e-2
