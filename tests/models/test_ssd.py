"""models.ssd (the project's chunked SSD) against oracles it shares no code with:

- a naive sequential recurrence written here, step by step over time:
      S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D x_t
- mamba_ssm's ``ssd_minimal_discrete`` (Listing 1 of the Mamba-2 paper), where importable.

Forward values and gradients (x, dt, A_log, B, C, D, dt_bias), on fresh random inputs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from models.ssd import discretize_dt, segment_sum, ssd_chunked


def naive_recurrence(x, dt, A, B, C, D):
    """x (b,l,h,p); dt (b,l,h) > 0; A (h,) < 0; B, C (b,l,g,n); D (h,) -> y (b,l,h,p)."""
    batch, length, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    per_group = heads // groups
    B_heads = B.repeat_interleave(per_group, dim=2)  # head h reads group h // per_group
    C_heads = C.repeat_interleave(per_group, dim=2)
    state = x.new_zeros(batch, heads, head_dim, state_size)
    outputs = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        update = (dt[:, t, :, None] * x[:, t])[..., None] * B_heads[:, t, :, None, :]  # (b, h, p, n)
        state = decay[..., None, None] * state + update
        outputs.append((state * C_heads[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t])
    return torch.stack(outputs, dim=1)


def random_inputs(batch=2, length=50, heads=4, groups=2, head_dim=3, state=5, dtype=torch.float64):
    # Broad dt (softplus of N(-1, 1) plus a bias) and A in -[1, 16]: strong, varied decays.
    return dict(
        x=torch.randn(batch, length, heads, head_dim, dtype=dtype),
        dt_raw=torch.randn(batch, length, heads, dtype=dtype) - 1.0,
        A_log=torch.empty(heads, dtype=dtype).uniform_(0.0, 2.77),
        B=torch.randn(batch, length, groups, state, dtype=dtype),
        C=torch.randn(batch, length, groups, state, dtype=dtype),
        D=torch.randn(heads, dtype=dtype),
        dt_bias=0.5 * torch.randn(heads, dtype=dtype),
    )


def _leaves(inputs):
    return {k: v.clone().requires_grad_(True) for k, v in inputs.items()}


def _ours(t, chunk_size, dt_min=0.0):
    return ssd_chunked(
        t["x"], t["dt_raw"], -torch.exp(t["A_log"]), t["B"], t["C"], chunk_size,
        D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True, dt_min=dt_min,
    )


def _naive(t, dt_min=0.0):
    dt = F.softplus(t["dt_raw"] + t["dt_bias"]).clamp(min=dt_min)
    return naive_recurrence(t["x"], dt, -torch.exp(t["A_log"]), t["B"], t["C"], t["D"])


def _value_and_grads(fn, inputs, weight):
    leaves = _leaves(inputs)
    y = fn(leaves)
    (y * weight).sum().backward()
    return y.detach(), {k: v.grad for k, v in leaves.items()}


@pytest.mark.parametrize("chunk_size", [8, 16, 64])
def test_matches_naive_recurrence_fp64_forward_and_grads(chunk_size):
    inputs = random_inputs()  # length 50: a partial last chunk for 8 and 16, one padded chunk for 64
    weight = torch.randn_like(inputs["x"])
    y_ours, g_ours = _value_and_grads(lambda t: _ours(t, chunk_size), inputs, weight)
    y_ref, g_ref = _value_and_grads(_naive, inputs, weight)
    assert y_ours.dtype == torch.float64
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-10, atol=1e-10)
    for name in inputs:
        torch.testing.assert_close(g_ours[name], g_ref[name], rtol=1e-9, atol=1e-9, msg=f"grad of {name}")


def test_matches_naive_recurrence_fp32():
    inputs = random_inputs(length=40, heads=8, groups=4, head_dim=4, state=8)
    weight = torch.randn_like(inputs["x"])
    y_ours, g_ours = _value_and_grads(lambda t: _ours(t, 16), {k: v.float() for k, v in inputs.items()}, weight.float())
    y_ref, g_ref = _value_and_grads(_naive, inputs, weight)
    assert y_ours.dtype == torch.float32
    torch.testing.assert_close(y_ours.double(), y_ref, rtol=1e-4, atol=1e-5)
    for name in inputs:
        torch.testing.assert_close(g_ours[name].double(), g_ref[name], rtol=1e-4, atol=1e-4, msg=f"grad of {name}")


def test_dt_clamp_matches_naive():
    inputs = random_inputs(length=24)
    inputs["dt_raw"] = inputs["dt_raw"] - 4.0  # many dt below the clamp
    y_ours = _ours(inputs, 8, dt_min=0.05)
    y_ref = _naive(inputs, dt_min=0.05)
    torch.testing.assert_close(y_ours, y_ref, rtol=1e-10, atol=1e-10)
    # The clamp is active: without it the outputs differ.
    assert (_ours(inputs, 8) - y_ref).abs().max() > 1e-3


def test_causal():
    inputs = random_inputs(length=32)
    y = _ours(inputs, 8)
    later = {k: v.clone() for k, v in inputs.items()}
    for key in ("x", "dt_raw", "B", "C"):
        later[key][:, 20:] = torch.randn_like(later[key][:, 20:])
    y_changed = _ours(later, 8)
    torch.testing.assert_close(y_changed[:, :20], y[:, :20], rtol=0, atol=0)
    assert (y_changed[:, 20:] - y[:, 20:]).abs().max() > 1e-3


def test_segment_sum_definition():
    values = torch.randn(3, 7, dtype=torch.float64)
    out = segment_sum(values)
    for i in range(7):
        for j in range(7):
            if j > i:
                assert out[:, i, j].eq(float("-inf")).all()
            else:
                torch.testing.assert_close(out[:, i, j], values[:, j + 1 : i + 1].sum(-1))


def test_discretize_dt():
    dt_raw, bias = torch.randn(4, 6), torch.randn(6)
    torch.testing.assert_close(discretize_dt(dt_raw, bias), F.softplus(dt_raw + bias))
    assert discretize_dt(dt_raw - 20, bias, dt_min=0.01).min() == pytest.approx(0.01)


# --- mamba_ssm's reference -------------------------------------------------------------


def _import_ssd_minimal():
    """mamba_ssm.modules.ssd_minimal without mamba_ssm's package __init__ (compiled extension).

    ssd_minimal imports mamba_ssm's Triton module at its top although ssd_minimal_discrete is
    plain torch; where triton is absent (CPU CI) that one import is stubbed while loading, and
    sys.modules is restored afterwards so nothing else sees the stub.
    """
    if importlib.util.find_spec("mamba_ssm") is None:
        return None
    from models.kernels.mamba_ssm_triton import import_mamba_ssm_submodule

    needs_stub = importlib.util.find_spec("triton") is None
    before = {k: v for k, v in sys.modules.items() if k == "mamba_ssm" or k.startswith("mamba_ssm.")}
    try:
        if needs_stub:
            import_mamba_ssm_submodule("ops.triton")  # real, empty package __init__ files
            stub = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
            stub.mamba_chunk_scan_combined = None
            sys.modules[stub.__name__] = stub
        return import_mamba_ssm_submodule("modules.ssd_minimal").ssd_minimal_discrete
    except Exception:
        return None
    finally:
        if needs_stub:
            for key in [k for k in sys.modules if k == "mamba_ssm" or k.startswith("mamba_ssm.")]:
                del sys.modules[key]
            sys.modules.update(before)


@pytest.fixture(scope="module")
def ssd_minimal_discrete():
    # Imported when the test runs, not at collection (see test_model_gpu_kernels.triton_kernels).
    function = _import_ssd_minimal()
    if function is None:
        pytest.skip("mamba_ssm not installed (docs/model.md gives the CPU install command)")
    return function


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_mamba_ssm_ssd_minimal(ssd_minimal_discrete, dtype):
    inputs = random_inputs(length=48, heads=6, groups=3, head_dim=4, state=8, dtype=dtype)
    chunk = 16
    weight = torch.randn_like(inputs["x"])

    def theirs(t):
        dt = F.softplus(t["dt_raw"] + t["dt_bias"])
        A = -torch.exp(t["A_log"])
        per_group = t["x"].shape[2] // t["B"].shape[2]
        y, _ = ssd_minimal_discrete(
            t["x"] * dt[..., None], A * dt,
            t["B"].repeat_interleave(per_group, dim=2), t["C"].repeat_interleave(per_group, dim=2), chunk,
        )
        return y + t["D"][:, None] * t["x"]

    y_ours, g_ours = _value_and_grads(lambda t: _ours(t, chunk), inputs, weight)
    y_ref, g_ref = _value_and_grads(theirs, inputs, weight)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(y_ours, y_ref, rtol=tol, atol=tol)
    for name in inputs:
        torch.testing.assert_close(g_ours[name], g_ref[name], rtol=tol, atol=tol, msg=f"grad of {name}")
