"""Independent oracles for the low-precision formats: numpy fp32 arithmetic plus ml_dtypes casts.

Written from the NVFP4 formulas of docs/numerics.md, the OCP MX spec and TE's recipe code, without calling
models.quant: E2M1, E4M3 and E8M0 rounding come from ml_dtypes (round half to even), scalar
arithmetic is numpy float32 (IEEE), powers of two come from bit fields or np.frexp.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E2M1 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def to_numpy_f32(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy().astype(np.float32)


def blocks(x: np.ndarray, tile):
    """[R, C] -> [R/tr, tr, C/tc, tc] (per tensor: [1, R, 1, C])."""
    rows, cols = x.shape
    if tile is None:
        return x.reshape(1, rows, 1, cols)
    return x.reshape(rows // tile[0], tile[0], cols // tile[1], tile[1])


def e2m1_rne(values: np.ndarray) -> np.ndarray:
    """fp32 -> E2M1 grid value (saturate at 6, then ml_dtypes' RNE cast), as fp32."""
    return np.clip(values, -6.0, 6.0).astype(E2M1).astype(F32)


def e2m1_codes(values: np.ndarray) -> np.ndarray:
    return np.clip(values, -6.0, 6.0).astype(E2M1).view(np.uint8)


def e4m3_rne(values: np.ndarray) -> np.ndarray:
    """fp32 -> E4M3 (saturate at 448, then ml_dtypes' RNE cast), as fp32."""
    return np.clip(values, -448.0, 448.0).astype(E4M3).astype(F32)


def e2m1_stochastic(values: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Round |v| (saturated at 6) up to the next E2M1 grid point iff u < (|v| - lo) / (hi - lo)."""
    magnitude = np.minimum(np.abs(values.astype(np.float64)), 6.0)
    lower_index = np.searchsorted(E2M1_GRID, magnitude, side="right") - 1
    upper_index = np.minimum(lower_index + 1, 7)
    lower, upper = E2M1_GRID[lower_index], E2M1_GRID[upper_index]
    step = np.where(upper > lower, upper - lower, 1.0)
    fraction = np.where(upper > lower, (magnitude - lower) / step, 0.0)
    rounded = np.where(uniform.astype(np.float64) < fraction, upper, lower)
    return np.where(np.signbit(values), -rounded, rounded).astype(F32)


def nvfp4(x: np.ndarray, tile=(1, 16), uniform=None, scale_max: float = 448.0, round_scale=None):
    """The NVFP4 formulas of docs/numerics.md. Returns dict: xhat, scaled (q*s_b), q, codes (RNE only), s_b, decode.
    `scale_max` and `round_scale` (default E4M3 RNE) name the block-scale format (nvfp4_ue5m3: another one)."""
    round_scale = e4m3_rne if round_scale is None else round_scale
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        amax = F32(np.max(np.abs(x)))
        encode = F32(F32(scale_max * 6.0) / amax)
        encode = min(encode, FLT_MAX)
        if amax == 0 or encode == 0:
            encode = F32(1.0)
        decode = F32(F32(1.0) / encode)
        blocked = blocks(x, tile)
        block_amax = np.max(np.abs(blocked), axis=(1, 3), keepdims=True).astype(F32)
        scale = round_scale((block_amax * F32(encode * F32(1.0 / 6.0))).astype(F32))
        reciprocal = np.minimum(F32(1.0) / (scale * decode), FLT_MAX).astype(F32)
        scaled_input = (blocked * reciprocal).astype(F32)  # v = x * r_b, what E2M1 rounds
    if uniform is None:
        q = e2m1_rne(scaled_input)
        codes = e2m1_codes(scaled_input).reshape(x.shape)
    else:
        q = e2m1_stochastic(scaled_input, blocks(uniform, tile))
        codes = None
    scaled = (q * scale).astype(F32)
    xhat = (scaled * decode).astype(F32)
    return {
        "xhat": xhat.reshape(x.shape),
        "scaled": scaled.reshape(x.shape),
        "q": q.reshape(x.shape),
        "codes": codes,
        "s_b": scale[:, 0, :, 0],
        "decode": decode,
        "amax": amax,
        "v": scaled_input.reshape(x.shape),
    }


# The fp32 constant of TE's dequantize kernel: 1 / (6 * 448) computed in double, rounded once.
TE_DEQUANTIZE_FACTOR = F32(1.0 / 2688.0)


def nvfp4_te_standalone_dequantize(x: np.ndarray, tile=(1, 16)) -> np.ndarray:
    """TE's standalone NVFP4 dequantize (dequantize_nvfp4.cuh, dequantize_fp4_kernel), in fp32.

    From the quantized q and E4M3 s_b of ``nvfp4`` above and the tensor amax: per block
    final = fp32(fp32(s_b * amax) * fp32(1/2688)), then x = fp32(q * final).
    """
    out = nvfp4(x, tile)
    with np.errstate(invalid="ignore", over="ignore"):
        final = ((out["s_b"] * out["amax"]).astype(F32) * TE_DEQUANTIZE_FACTOR).astype(F32)
        values = blocks(out["q"], tile) * final[:, None, :, None]
    return values.astype(F32).reshape(x.shape)


def te_reference_e2m1_codes(v: np.ndarray) -> np.ndarray:
    """E2M1 codes as TE's pure-torch NVFP4QuantizerRef stores them (reference_nvfp4.py, cast_to_fp4x2).

    Its rule: RNE onto the grid after saturating (the same codes as ml_dtypes' cast), except that a
    zero of either sign is stored as code 0: the positive range there is 0 <= v <= 0.25, which
    -0.0 satisfies, and code 8 (-0) needs -0.25 <= v < 0. NaN also gets code 0.
    """
    codes = e2m1_codes(v)
    return np.where((v == 0) | np.isnan(v), np.uint8(0), codes).astype(np.uint8)


def decode_e2m1_codes(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes (one per uint8, low nibble) to fp32 through ml_dtypes: code 8 decodes to -0.0."""
    return codes.astype(np.uint8).view(E2M1).astype(F32)


MX_EMAX = {"mxfp4": 2, "mxfp8": 8}


def mx(x: np.ndarray, fmt: str):
    """OCP MX v1.0: X = 2^clamp(floor(log2 amax) - emax, -127, 127) (zero block: 2^-127); q = elem(x / X)."""
    block_amax = np.max(np.abs(blocks(x, (1, 32))), axis=(1, 3), keepdims=True).astype(F32)
    biased = ((block_amax.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    # floor(log2(amax)) = biased - 127 for normal amax; subnormal or zero amax clamp to -127 anyway.
    exponent = np.where(biased == 0, -127, biased - 127 - MX_EMAX[fmt])
    exponent = np.clip(exponent, -127, 127)
    scale = np.ldexp(np.float64(1.0), exponent).astype(F32)
    scale_codes = scale.astype(E8M0).view(np.uint8)[:, 0, :, 0]
    element = e2m1_rne if fmt == "mxfp4" else e4m3_rne
    q = element((blocks(x, (1, 32)) / scale).astype(F32))
    xhat = (q * scale).astype(F32)
    return {"xhat": xhat.reshape(x.shape), "scale_codes": scale_codes}


def fp8_scaled(x: np.ndarray, tile, *, power_of_two: bool, value_for_inf: float):
    """TE compute_scale_from_amax (eps 0): scale = 448 / amax (inf -> value_for_inf, amax 0 -> 1)."""
    block_amax = np.max(np.abs(blocks(x, tile)), axis=(1, 3), keepdims=True).astype(F32)
    with np.errstate(divide="ignore", over="ignore"):
        scale = (F32(448.0) / block_amax).astype(F32)
    scale = np.where(np.isinf(scale), F32(value_for_inf), scale).astype(F32)
    scale = np.where(block_amax == 0, F32(1.0), scale).astype(F32)
    if power_of_two:
        _, exponent = np.frexp(scale)  # scale = m * 2^e, m in [0.5, 1): round down = 2^(e - 1)
        scale = np.ldexp(np.float64(1.0), exponent - 1).astype(F32)
    decode = (F32(1.0) / scale).astype(F32)
    q = e4m3_rne((blocks(x, tile) * scale).astype(F32))
    xhat = (q * decode).astype(F32)
    return {"xhat": xhat.reshape(x.shape), "decode": decode[:, 0, :, 0]}


def hadamard_16() -> np.ndarray:
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h


RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float64)


def rht_matrix() -> np.ndarray:
    """TE's M = diag(s) @ H16 / 4 (float64); rht(x) = x @ M on 16-wide tiles of the last dim."""
    return np.diag(RHT_SIGNS) @ hadamard_16() / 4.0


def rht_float64(x: np.ndarray) -> np.ndarray:
    shape = x.shape
    return (x.astype(np.float64).reshape(-1, 16) @ rht_matrix()).reshape(shape)


def fresh_input(rows: int, cols: int, scale: float, dtype: torch.dtype, *, block: int = 16) -> torch.Tensor:
    """Random normal * scale with outliers, a tiny block (denormal block scales) and a zero block."""
    x = torch.randn(rows, cols, dtype=torch.float64) * scale
    outliers = torch.randint(0, rows * cols, (max(1, rows * cols // 200),))
    x.view(-1)[outliers] *= 50.0
    row = torch.randint(0, rows, (1,)).item()
    x[row, :block] *= 1e-5  # E4M3 block scale far below the tensor's: subnormal or zero s_b
    row = torch.randint(0, rows, (1,)).item()
    x[row, cols - block :] = 0.0  # an all-zero block
    return x.to(dtype)


def cuda_input(shape, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fresh_input of `shape`, made in fp32, cast to `dtype`, on the GPU (the GPU kernel tests' inputs)."""
    return fresh_input(shape[0], shape[1], scale, torch.float32).to(dtype).cuda()


def assert_layer_kernels_match_torch_path(kernels, module, x: torch.Tensor, dy: torch.Tensor) -> None:
    """A CUDA QuantLinear's Y, dX and dW with the kernels on, then off (round to nearest, so that neither
    path draws): Y and dX bit-identical. Wgrad's operands are bit-identical too, but the kernels hand
    them to cuBLAS as transposed views (no copy), which may change the fp32 accumulation order: dW within
    one bf16 rounding step, and equal in at least 99% of its elements."""
    results = []
    try:
        for use in (True, False):
            kernels.use_triton(use)
            module.weight.grad = None
            xi = x.clone().requires_grad_(True)
            y = module(xi)
            y.backward(dy)
            results.append((y.detach(), xi.grad, module.weight.grad.clone()))
    finally:
        kernels.use_triton(True)
    (y_fast, dx_fast, dw_fast), (y_ref, dx_ref, dw_ref) = results
    assert torch.equal(y_fast, y_ref) and torch.equal(dx_fast, dx_ref)
    torch.testing.assert_close(dw_fast, dw_ref, rtol=2**-7, atol=0)
    assert (dw_fast == dw_ref).float().mean() > 0.99


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal element for element, NaN equal to NaN (-0.0 == 0.0 numerically; codes compare the sign bit)."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    a, e = actual.float(), expected.float()
    same = (a == e) | (a.isnan() & e.isnan())
    assert same.all(), f"{what}: {(~same).sum().item()} of {same.numel()} differ"


# ------------------------------------------------------------------------------------------------
# Stochastic rounding's random bits in the E2M1 kernels, re-implemented from the Philox4x32-10
# definition (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the round and
# key constants of Random123, which Triton's tl.randint4x uses) in numpy uint64 arithmetic.

PHILOX_ROUND = (0xD2511F53, 0xCD9E8D57)
PHILOX_KEY_STEP = (0x9E3779B9, 0xBB67AE85)
MASK_32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(seed: int, counters: np.ndarray):
    """The four 32-bit words (uint64 arrays) of Philox4x32-10 for each counter (uint64 offsets): key
    = (seed low, seed high 32 bits), counter = (offset low, offset high, 0, 0)."""
    counters = np.asarray(counters, dtype=np.uint64)
    c0, c1 = counters & MASK_32, counters >> np.uint64(32)
    c2 = c3 = np.zeros_like(counters)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    a, b = np.uint64(PHILOX_ROUND[0]), np.uint64(PHILOX_ROUND[1])
    for _ in range(10):
        product_a, product_b = a * c0, b * c2  # < 2^64: exact in uint64
        c0, c1, c2, c3 = ((product_b >> np.uint64(32)) ^ c1 ^ k0, product_b & MASK_32,
                          (product_a >> np.uint64(32)) ^ c3 ^ k1, product_a & MASK_32)
        k0 = (k0 + np.uint64(PHILOX_KEY_STEP[0])) & MASK_32
        k1 = (k1 + np.uint64(PHILOX_KEY_STEP[1])) & MASK_32
    return c0, c1, c2, c3


def _uniform_of_byte(word: np.ndarray, byte: np.ndarray) -> np.ndarray:
    return ((((word >> (np.uint64(8) * byte.astype(np.uint64))) & np.uint64(255)).astype(np.float64) + 0.5)
            / 256.0).astype(np.float32)


def mx_rows_uniforms(seed: int, rows: int, cols: int) -> torch.Tensor:
    """The uniforms the MX rows kernel draws for x [rows, cols]: element (r, c) is byte c % 4 of word
    (w0, w2, w1, w3)[(c % 16) // 4] of Philox at the offset of (r, 16 * (c // 16))."""
    r, c = np.meshgrid(np.arange(rows, dtype=np.uint64), np.arange(cols, dtype=np.uint64), indexing="ij")
    words = philox4x32_10(seed, r * np.uint64(cols) + (c // np.uint64(16)) * np.uint64(16))
    ordered = np.stack([words[0], words[2], words[1], words[3]])
    position = ((c % np.uint64(16)) // np.uint64(4)).astype(np.int64)
    word = np.take_along_axis(ordered, position[None], axis=0)[0]
    return torch.from_numpy(_uniform_of_byte(word, c % np.uint64(4)))


def mx_columns_uniforms(seed: int, rows: int, cols: int) -> torch.Tensor:
    """The uniforms the MX columns kernel draws for x [rows, cols]: element (r, c) is byte r % 4 of
    word (r % 16) // 4 of Philox at the offset of (16 * (r // 16), c)."""
    r, c = np.meshgrid(np.arange(rows, dtype=np.uint64), np.arange(cols, dtype=np.uint64), indexing="ij")
    words = np.stack(philox4x32_10(seed, (r // np.uint64(16)) * np.uint64(16 * cols) + c))
    position = ((r % np.uint64(16)) // np.uint64(4)).astype(np.int64)
    word = np.take_along_axis(words, position[None], axis=0)[0]
    return torch.from_numpy(_uniform_of_byte(word, r % np.uint64(4)))


def four_over_six(x: np.ndarray, tile=(1, 16), error: str = "mse", uniform=None):
    """Four Over Six by brute force: every block quantized with both candidate scales, the lower error kept.

    TE's 4over6 arithmetic (quantize_4over6_nvfp4.cuh): S_enc = 1536 / amax (E4M3 bound 256),
    base = (block_amax / 6) * S_enc, s4 = e4m3(base * 1.5), s6 = e4m3(base); candidate k rounds
    x * r_k to E2M1 (RNE), its error sums d^2 (mse) or |d| (mae), d = ((q * s_k) * amax) / 1536 - x,
    in fp32 along each row of the block from element 0, then (16x16 tiles) over the 16 row sums as the
    warp reduction adds them (rows i and i + 8, then i and i + 4, ...). Map-to-4 wins only if strictly
    lower. ``uniform``: round the chosen candidate stochastically with these draws (the choice is the
    RNE one). Returns dict: scaled (q * s_b), codes (RNE only), s_b, decode, map_to_4 [R/tr, C/tc],
    errors (4, 6).
    """
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        amax = F32(np.max(np.abs(x)))
        encode = min(F32(F32(1536.0) / amax), FLT_MAX)
        if amax == 0 or encode == 0:
            encode = F32(1.0)
        decode = F32(F32(1.0) / encode)
        blocked = blocks(x, tile).astype(F32)
        block_amax = np.max(np.abs(blocked), axis=(1, 3), keepdims=True).astype(F32)
        base = ((block_amax / F32(6.0)).astype(F32) * encode).astype(F32)
        candidates = {}
        for name, factor in (("4", F32(1.5)), ("6", F32(1.0))):
            scale = e4m3_rne((base * factor).astype(F32))
            reciprocal = np.minimum(F32(1.0) / (scale * decode), FLT_MAX).astype(F32)
            v = (blocked * reciprocal).astype(F32)
            q = e2m1_rne(v)
            dequantized = ((((q * scale).astype(F32) * amax).astype(F32)) / F32(1536.0)).astype(F32)
            d = (dequantized - blocked).astype(F32)
            per_element = (d * d).astype(F32) if error == "mse" else np.abs(d)
            row_sums = np.zeros(per_element.shape[:3] + (1,), dtype=F32)
            for j in range(per_element.shape[3]):
                row_sums = (row_sums + per_element[..., j:j + 1]).astype(F32)
            while row_sums.shape[1] > 1:
                half = row_sums.shape[1] // 2
                row_sums = (row_sums[:, :half] + row_sums[:, half:]).astype(F32)
            candidates[name] = (scale, reciprocal, v, q, row_sums)
    map_to_4 = candidates["4"][4] < candidates["6"][4]
    scale, reciprocal, v, q, _ = (np.where(map_to_4, a, b) for a, b in zip(candidates["4"], candidates["6"]))
    codes = None
    if uniform is None:
        codes = e2m1_codes(v).reshape(x.shape)
    else:
        q = e2m1_stochastic(v, blocks(uniform, tile))
    return {
        "scaled": (q * scale).astype(F32).reshape(x.shape),
        "codes": codes,
        "s_b": scale[:, 0, :, 0],
        "decode": decode,
        "map_to_4": map_to_4[:, 0, :, 0],
        "errors": (candidates["4"][4][:, 0, :, 0], candidates["6"][4][:, 0, :, 0]),
    }


def ue5m3_values() -> np.ndarray:
    """The 255 finite UE5M3 values (float64, by code 0..254): code e m (e = code >> 3, m = code & 7) is
    m * 2^-17 for e = 0, else 2^(e - 15) * (1 + m / 8); code 255 is NaN."""
    codes = np.arange(255)
    exponent, mantissa = codes >> 3, codes & 7
    return np.where(exponent == 0, mantissa * 2.0**-17, 2.0 ** (exponent - 15.0) * (1 + mantissa / 8))


def ue5m3_brute_force(values: np.ndarray) -> np.ndarray:
    """UE5M3 RNE by search over every code: the nearest finite value (saturating), a tie to the even code."""
    grid = ue5m3_values()
    v = np.minimum(values.astype(np.float64).reshape(-1, 1), grid[-1])
    distance = np.abs(v - grid[None, :])
    nearest = distance == distance.min(axis=1, keepdims=True)
    even = nearest & (np.arange(255) % 2 == 0)[None, :]
    code = np.where(even.any(axis=1), even.argmax(axis=1), nearest.argmax(axis=1))
    return grid[code].astype(F32).reshape(values.shape)


def nvfp4_ue5m3(x: np.ndarray, tile=(1, 16)):
    """nvfp4 with UE5M3 block scales: S_enc = 688128 / amax (114688 * 6), s_b = ue5m3(block_amax * (S_enc * (1/6))),
    the scale rounded by the brute-force search over every UE5M3 code."""
    return nvfp4(x, tile, scale_max=114688.0, round_scale=ue5m3_brute_force)
