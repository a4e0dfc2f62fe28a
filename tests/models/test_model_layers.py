"""Layer math: causal conv forms, norms vs transformers' NemotronH modules, attention, MLP, backends."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers.models.nemotron_h import modeling_nemotron_h as hf_nemotron_h

from model_testing import make_model, randomize_trivial_params, tiny_config
from models.attention import Attention
from models.kernels import causal_conv, resolve_backend, resolve_conv_backend
from models.mamba2 import Mamba2Mixer
from models.mlp import MLP
from models.norms import GatedRMSNorm, RMSNorm, gated_rms_norm_reference


def test_causal_conv_shifted_matches_conv1d_forward_and_grads():
    # x is a strided view of a wider tensor, as the [x, B, C] slice of in_proj's output is.
    wide = torch.randn(2, 29, 40, dtype=torch.float64)
    weight = torch.randn(24, 4, dtype=torch.float64)
    bias = torch.randn(24, dtype=torch.float64)
    grad_out = torch.randn(2, 29, 24, dtype=torch.float64)
    results = []
    for fn in (causal_conv.causal_conv1d_silu_conv1d, causal_conv.causal_conv1d_silu_shifted):
        w, leaves = wide.clone().requires_grad_(True), [weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)]
        x = w[..., 10:34]
        y = fn(x, *leaves)
        (y * grad_out).sum().backward()
        results.append((y.detach(), w.grad, leaves[0].grad, leaves[1].grad))
    for ref, got, name in zip(results[0], results[1], ("y", "dx", "dweight", "dbias")):
        # the shifted form accumulates in fp32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5, msg=name)


def test_causal_conv_is_causal_and_matches_definition():
    x = torch.randn(1, 12, 3, dtype=torch.float64)
    weight, bias = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    y = causal_conv.causal_conv1d_silu_conv1d(x, weight, bias)
    for t in range(12):
        acc = bias.clone()
        for k in range(4):
            src = t - 3 + k
            if src >= 0:
                acc = acc + weight[:, k] * x[0, src]
        torch.testing.assert_close(y[0, t], F.silu(acc))


def test_rmsnorm_matches_transformers():
    ours = RMSNorm(48, eps=1e-5)
    ours.init_weights()
    with torch.no_grad():
        ours.weight.add_(torch.randn(48))
    theirs = hf_nemotron_h.NemotronHRMSNorm(48, eps=1e-5)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 48) * 3
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
    xb = x.bfloat16()
    torch.testing.assert_close(ours(xb), theirs(xb), rtol=0, atol=0)  # both compute in fp32, cast once


def test_gated_norm_matches_transformers():
    ours = GatedRMSNorm(64, group_size=16, eps=1e-5, backend="torch")
    ours.init_weights()
    with torch.no_grad():
        ours.weight.add_(torch.randn(64))
    theirs = hf_nemotron_h.NemotronHRMSNormGated(64, group_size=16, eps=1e-5)
    theirs.load_state_dict(ours.state_dict())
    x, z = torch.randn(2, 7, 64), torch.randn(2, 7, 64)
    torch.testing.assert_close(ours(x, z), theirs(x, z), rtol=1e-6, atol=1e-6)
    # Grouping matters: one group over all channels gives a different answer.
    assert (gated_rms_norm_reference(x, z, ours.weight, 64, 1e-5) - ours(x, z)).abs().max() > 1e-3


def test_attention_matches_explicit_softmax():
    cfg = tiny_config()
    attention = Attention(cfg)
    attention.init_weights(0.05)
    x = torch.randn(2, 9, cfg.hidden_size)
    q = attention.q_proj(x).view(2, 9, 4, 16).transpose(1, 2)
    k = attention.k_proj(x).view(2, 9, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attention.v_proj(x).view(2, 9, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-1, -2) / 4.0
    scores = scores.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    expected = attention.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 64))
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_mlp_is_squared_relu():
    cfg = tiny_config()
    mlp = MLP(cfg)
    mlp.init_weights(0.05)
    x = torch.randn(3, cfg.hidden_size)
    expected = mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2)
    torch.testing.assert_close(mlp(x), expected)


def test_backend_switch_flips_on_cpu():
    """ssd_backend 'torch' and 'auto' agree on CPU (auto resolves to torch); 'triton' is refused there."""
    cfg = tiny_config(ssd_backend="torch", gated_norm_backend="torch")
    model = make_model(cfg, seed=3)
    randomize_trivial_params(model)
    ids = torch.randint(0, cfg.vocab_size, (2, 21))
    auto_model = make_model(dataclasses.replace(cfg, ssd_backend="auto", gated_norm_backend="auto"), seed=3)
    auto_model.load_state_dict(model.state_dict())
    torch.testing.assert_close(auto_model(ids), model(ids), rtol=0, atol=0)
    assert resolve_backend("auto", torch.device("cpu"), "ssd_backend") == "torch"
    assert resolve_conv_backend("auto", torch.device("cpu")) == "conv1d"
    with pytest.raises(RuntimeError, match="ssd_backend"):
        make_model(dataclasses.replace(cfg, ssd_backend="triton"))
    with pytest.raises(RuntimeError, match="gated_norm_backend"):
        make_model(dataclasses.replace(cfg, gated_norm_backend="triton"))


def test_mixer_conv_backends_agree_eagerly(monkeypatch):
    """The 'compiled' conv form, run eagerly (no compiler on CPU CI), gives the mixer the same output."""
    cfg = tiny_config()
    mixer = Mamba2Mixer(cfg)
    mixer.init_weights(0.02)
    x = torch.randn(2, 19, cfg.hidden_size)
    reference = mixer(x)
    monkeypatch.setattr(causal_conv, "compiled_causal_conv1d_silu", causal_conv.causal_conv1d_silu_shifted)
    mixer.config = dataclasses.replace(cfg, conv_backend="compiled")
    torch.testing.assert_close(mixer(x), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_conv_traces_and_matches_on_cpu():
    """The torch.compile'd conv (the CUDA default) compiles as one full graph and matches
    F.conv1d, forward and backward. ~20 s of compilation on CPU, hence slow."""
    wide = torch.randn(2, 50, 40, dtype=torch.float32)
    weight, bias = torch.randn(24, 4), torch.randn(24)
    grad_out = torch.randn(2, 50, 24)
    results = []
    for fn in (causal_conv.compiled_causal_conv1d_silu, causal_conv.causal_conv1d_silu_conv1d):
        w_leaf, wt, b = wide.clone().requires_grad_(True), weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        y = fn(w_leaf[..., 5:29], wt, b)
        (y * grad_out).sum().backward()
        results.append((y.detach(), w_leaf.grad, wt.grad, b.grad))
    for got, ref, name in zip(results[0], results[1], ("y", "dx", "dweight", "dbias")):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=name)
