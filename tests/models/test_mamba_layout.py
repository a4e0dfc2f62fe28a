"""The Mamba-2 group-major in_proj / conv1d layout: the permutation, the init and forward it keeps, and the
Hugging Face round trip (the logits parity against transformers is tests/models/test_hf.py, G = 2)."""

from __future__ import annotations

import torch

from model_testing import make_model, randomize_trivial_params, tiny_config
from models.hf import mamba_to_canonical, mamba_to_group_major, to_hf_state_dict
from models.kernels import causal_conv
from models.mamba2 import Mamba2Mixer, conv_group_major_index, in_proj_group_major_index, inverse_index
from models.ssd import ssd_chunked


def test_the_index_orders_each_group_z_x_B_C_dt():
    # d = 4 (2 heads x 2), G = 2, N = 1: canonical rows z0 z1 z2 z3 | x0..x3 | B0 B1 | C0 C1 | dt0 dt1
    cfg = tiny_config(mamba_num_heads=2, mamba_head_dim=2, mamba_num_groups=2, ssm_state_size=1)
    assert in_proj_group_major_index(cfg).tolist() == [0, 1, 4, 5, 8, 10, 12, 2, 3, 6, 7, 9, 11, 13]
    assert conv_group_major_index(cfg).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]


def test_one_group_is_the_canonical_order_and_the_index_is_a_permutation():
    one = tiny_config(mamba_num_groups=1)
    rows = 2 * one.mamba_inner_size + 2 * one.ssm_state_size + one.mamba_num_heads
    assert torch.equal(in_proj_group_major_index(one), torch.arange(rows))
    assert torch.equal(conv_group_major_index(one), torch.arange(one.mamba_inner_size + 2 * one.ssm_state_size))
    cfg = tiny_config()  # 2 groups
    for index in (in_proj_group_major_index(cfg), conv_group_major_index(cfg)):
        assert torch.equal(torch.sort(index).values, torch.arange(len(index)))
        assert torch.equal(index[inverse_index(index)], torch.arange(len(index)))


def test_init_draws_the_canonical_model_of_the_seed():
    """A seed gives the same model as the canonical layout did, value for value: in_proj and conv1d
    are drawn in the canonical order (the draws the earlier code made), then permuted."""
    cfg = tiny_config()
    mixer = Mamba2Mixer(cfg)
    torch.manual_seed(3)
    mixer.init_weights(0.01)
    conv = torch.nn.Conv1d(mixer.conv_dim, mixer.conv_dim, cfg.conv_kernel, groups=mixer.conv_dim)
    torch.manual_seed(3)
    in_proj = torch.empty_like(mixer.in_proj.weight).normal_(0.0, cfg.init_std)
    torch.empty_like(mixer.out_proj.weight).normal_(0.0, 0.01)
    conv.reset_parameters()
    assert torch.equal(mixer.in_proj.weight, in_proj[in_proj_group_major_index(cfg)])
    assert torch.equal(mixer.conv1d.weight, conv.weight[conv_group_major_index(cfg)])
    assert torch.equal(mixer.conv1d.bias, conv.bias[conv_group_major_index(cfg)])


def _canonical_forward(mixer: Mamba2Mixer, in_proj: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor,
                       hidden: torch.Tensor) -> torch.Tensor:
    """The mixer's forward as written for the canonical [z, x, B, C, dt] layout (the earlier code)."""
    projected = hidden @ in_proj.t()
    z, xBC, dt = torch.split(projected, [mixer.inner_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    xBC = causal_conv.causal_conv1d_silu_conv1d(xBC, conv_weight.squeeze(1), conv_bias)
    width = mixer.num_groups * mixer.state_size
    x, B, C = torch.split(xBC, [mixer.inner_size, width, width], dim=-1)
    x = x.unflatten(-1, (mixer.num_heads, mixer.head_dim))
    B = B.unflatten(-1, (mixer.num_groups, mixer.state_size))
    C = C.unflatten(-1, (mixer.num_groups, mixer.state_size))
    y = ssd_chunked(x, dt, -torch.exp(mixer.A_log.float()), B, C, mixer.chunk_size, D=mixer.D, dt_bias=mixer.dt_bias,
                    dt_softplus=True, dt_min=mixer.config.time_step_clamp_min)
    return mixer.out_proj(mixer.norm(y.flatten(-2), z))


def test_the_forward_computes_what_the_canonical_layout_computed():
    """Bit for bit, with one group (the study model) and with two."""
    for groups in (1, 2):
        cfg = tiny_config(mamba_num_groups=groups, conv_backend="conv1d", ssd_backend="torch", gated_norm_backend="torch")
        model = make_model(cfg, seed=groups)
        randomize_trivial_params(model)
        mixer = model.layers[0].mixer
        canonical = mamba_to_canonical(model.state_dict(), cfg)
        hidden = torch.randn(2, 40, cfg.hidden_size)
        with torch.no_grad():
            expected = _canonical_forward(mixer, canonical["layers.0.mixer.in_proj.weight"],
                                          canonical["layers.0.mixer.conv1d.weight"],
                                          canonical["layers.0.mixer.conv1d.bias"], hidden)
            assert torch.equal(mixer(hidden), expected), groups


def test_hf_state_dict_round_trips_to_our_layout():
    cfg = tiny_config()
    model = make_model(cfg, seed=4)
    ours = model.state_dict()
    hf_layout = to_hf_state_dict(model)  # HF names and order
    back = mamba_to_group_major({name.removeprefix("model."): t for name, t in hf_layout.items()}, cfg)
    for name, tensor in ours.items():
        assert torch.equal(back[name], tensor), name
    moved = {name for name, tensor in ours.items() if not torch.equal(mamba_to_canonical(ours, cfg)[name], tensor)}
    assert moved == {f"layers.{i}.mixer.{p}" for i in (0, 2, 4) for p in ("in_proj.weight", "conv1d.weight",
                                                                            "conv1d.bias")}
