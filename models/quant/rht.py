"""Random Hadamard transform (RHT) of NVFP4's Wgrad operands, in tiles of 16 along the last dim.

Transformer Engine's matrix (``transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py``,
``NVFP4QuantizerRef._build_hadamard_matrix`` / ``_apply_rht``; the JAX side builds the same
``diag(s) @ H / sqrt(16)``):

    M = diag(s) @ H16 / 4,          H16 Sylvester (H_{2n} = [[H_n, H_n], [H_n, -H_n]], symmetric)
    s = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]   (one fixed vector, all layers)
    rht(x)[..., 16 i : 16 i + 16] = x[..., 16 i : 16 i + 16] @ M

so the sign diagonal multiplies the input first and the Hadamard comes after:
y = H16 (s * x) / 4. M is orthogonal (M M^T = diag(s) H H^T diag(s) / 16 = I), so applying it to
both GEMM operands along the reduction dim cancels in the product: (A M)(B M)^T = A B^T.
inverse_rht(y) = y @ M^T = s * (H16 y) / 4.

Arithmetic (fixed, so the Triton kernel in ``models.quant.kernels`` matches bit for bit): fp32;
the sign flip is exact; H16 v is a fast Walsh-Hadamard butterfly of four stages with strides
8, 4, 2, 1, each mapping pairs (a, b) = (v[j], v[j + stride]) to (a + b, a - b); then * 0.25
(exact); the result is rounded once to the input's dtype (TE's RHT also returns the input dtype;
bf16 by ``bf16_rounding``, which torch.compile cannot drop).
"""

from __future__ import annotations

import torch

from models.quant.bf16_rounding import to_dtype_rounded

HADAMARD_SIZE = 16
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
"""TE's fixed random sign vector for the Wgrad RHT (``get_wgrad_sign_vector``)."""


def hadamard_matrix(size: int = HADAMARD_SIZE) -> torch.Tensor:
    """The unnormalized Sylvester Hadamard matrix (+-1 entries), fp32."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {size}")
    matrix = torch.ones(1, 1)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


def rht_matrix() -> torch.Tensor:
    """M = diag(s) @ H16 / 4 (fp32): rht(x) == x @ M blockwise, up to fp32 rounding."""
    signs = torch.tensor(RHT_SIGNS, dtype=torch.float32)
    return signs[:, None] * hadamard_matrix() / 4


def _walsh_hadamard_16_(v: torch.Tensor) -> torch.Tensor:
    """H16 applied along the last dim of v [..., 16] (fp32) by the fixed four-stage butterfly; overwrites v.

    Each stage copies its sums and differences into the halves of the other of two
    buffers (v and one scratch of ``empty_like(v)``, so v's memory order is kept: a transposed
    operand is processed where it lies, never copied to row-major). After four stages the result
    is back in v, which is returned.
    """
    buffers = (v, torch.empty_like(v))
    for stage, stride in enumerate((8, 4, 2, 1)):
        source, target = buffers[stage % 2], buffers[(stage + 1) % 2]
        pairs = source.unflatten(-1, (HADAMARD_SIZE // (2 * stride), 2, stride))
        out_pairs = target.unflatten(-1, (HADAMARD_SIZE // (2 * stride), 2, stride))
        first, second = pairs[..., 0, :], pairs[..., 1, :]
        # copy_ into the views, not out=: torch.compile cannot trace an op writing a strided out= view
        out_pairs[..., 0, :].copy_(first + second)
        out_pairs[..., 1, :].copy_(first - second)
    return v


def _check_last_dim(x: torch.Tensor, name) -> None:
    if x.ndim == 0 or x.shape[-1] % HADAMARD_SIZE != 0:
        where = f"{name}: " if name else ""
        raise ValueError(
            f"{where}the random Hadamard transform works in tiles of {HADAMARD_SIZE} along the last dim; "
            f"shape {list(x.shape)} does not divide"
        )


def _fp32_tiles(x: torch.Tensor) -> torch.Tensor:
    """A fresh fp32 copy of x viewed as [..., n / 16, 16], in x's memory order."""
    return x.to(torch.float32, copy=True).unflatten(-1, (-1, HADAMARD_SIZE))


def rht(x: torch.Tensor, *, name=None) -> torch.Tensor:
    """y = H16 (s * x) / 4 on each 16-wide tile of the last dim; same shape, dtype and memory order as x."""
    _check_last_dim(x, name)
    signs = torch.tensor(RHT_SIGNS, dtype=torch.float32, device=x.device)
    tiles = x.float().unflatten(-1, (-1, HADAMARD_SIZE))  # a view when x is fp32
    y = _walsh_hadamard_16_(tiles * signs).mul_(0.25)
    return to_dtype_rounded(y.reshape(x.shape), x.dtype)


def inverse_rht(y: torch.Tensor, *, name=None) -> torch.Tensor:
    """x = s * (H16 y) / 4 on each 16-wide tile of the last dim; the inverse (= transpose) of rht."""
    _check_last_dim(y, name)
    signs = torch.tensor(RHT_SIGNS, dtype=torch.float32, device=y.device)
    x = _walsh_hadamard_16_(_fp32_tiles(y)).mul_(0.25).mul_(signs)
    return to_dtype_rounded(x.reshape(y.shape), y.dtype)
