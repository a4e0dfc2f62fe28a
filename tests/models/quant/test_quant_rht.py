"""The random Hadamard transform: TE's matrix, orthogonality, inverse, exact op order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.quant.rht import RHT_SIGNS, inverse_rht, rht, rht_matrix

import quant_oracles as oracle


def test_matrix_is_signs_then_hadamard_over_4():
    """M = diag(s) @ H16 / 4 (TE: sign_matrix @ hadamard), with TE's sign vector."""
    assert list(RHT_SIGNS) == [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]
    np.testing.assert_array_equal(rht_matrix().double().numpy(), oracle.rht_matrix())
    # signs multiply the rows of H (the input), not its columns
    assert not np.array_equal(oracle.rht_matrix(), oracle.hadamard_16() @ np.diag(oracle.RHT_SIGNS) / 4)


def test_matrix_is_orthogonal():
    m = rht_matrix().double()
    torch.testing.assert_close(m @ m.T, torch.eye(16, dtype=torch.float64), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rht_matches_matrix_product(dtype):
    x = (torch.randn(6, 5, 64) * 3).to(dtype)
    expected = oracle.rht_float64(oracle.to_numpy_f32(x))
    y = rht(x)
    assert y.dtype == dtype and y.shape == x.shape
    # within one rounding to the dtype (the butterfly rounds in fp32 at each stage)
    tolerance = 2 * torch.finfo(dtype).eps * np.abs(expected).max()
    np.testing.assert_allclose(y.double().numpy(), expected, rtol=0, atol=tolerance)


def test_rht_exact_on_exactly_summable_input():
    """Multiples of 1/8 below 64: every butterfly sum is exact, so rht equals the exact product."""
    x = torch.randint(-512, 512, (32, 48)).float() / 8
    expected = oracle.rht_float64(x.numpy())
    assert np.array_equal(rht(x).double().numpy(), expected)
    bf16 = x.bfloat16()
    expected_bf16 = torch.from_numpy(oracle.rht_float64(bf16.float().numpy())).to(torch.bfloat16)
    assert torch.equal(rht(bf16), expected_bf16)


def test_inverse_rht_round_trips():
    x = torch.randn(8, 32, dtype=torch.float64).float()
    torch.testing.assert_close(inverse_rht(rht(x)), x, rtol=0, atol=4e-7)
    torch.testing.assert_close(rht(inverse_rht(x)), x, rtol=0, atol=4e-7)


def test_wgrad_with_rht_equals_plain_product():
    """Orthogonality in the GEMM: rht(dY^T) rht(X^T)^T = dY^T X along tokens, to fp32 rounding."""
    tokens, n, k = 64, 24, 40
    dy = torch.randn(tokens, n)
    x = torch.randn(tokens, k)
    plain = dy.double().t() @ x.double()
    transformed = rht(dy.t()).double() @ rht(x.t()).double().t()
    torch.testing.assert_close(transformed, plain, rtol=0, atol=2e-5 * plain.abs().max().item())
    # and it is not the identity: the operands really changed
    assert not torch.allclose(rht(x.t()), x.t())


def test_rht_shape_error_names_the_culprit():
    with pytest.raises(ValueError, match=r"my_layer.*tiles of 16"):
        rht(torch.randn(4, 24), name="my_layer")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_view_gives_the_same_bits_in_its_own_memory_order(dtype):
    """Wgrad transforms X^T and dY^T, column-major views: no copy to row-major, same result."""
    x = (torch.randn(64, 48) * 3).to(dtype)
    view = x.t()  # [48, 64]: tiles of 16 run down the columns of x
    y = rht(view)
    assert y.shape == view.shape and y.dtype == dtype
    assert torch.equal(_bits(y), _bits(rht(view.contiguous())))
    assert y.t().is_contiguous(), "the transform kept the input's (column-major) memory order"
    back = inverse_rht(y)
    assert torch.equal(_bits(back), _bits(inverse_rht(y.contiguous())))
    if dtype == torch.float32:
        torch.testing.assert_close(back, view, rtol=0, atol=4e-6)


def test_transforms_leave_their_input_alone():
    x = torch.randn(8, 32)
    original = x.clone()
    rht(x)
    inverse_rht(x)
    rht(x.t().contiguous().t())
    assert torch.equal(x, original)
