"""nvfp4_ue5m3 (NVFP4 with UE5M3 block scales) against a brute-force oracle that searches all 255 finite
UE5M3 codes for the nearest value (the kernels are checked against this reference in kernels_interpreted_ue5m3.py
and test_ue5m3_kernels_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.quant.formats import elements, quantize

import quant_oracles as oracle


def test_ue5m3_rounding_matches_the_search_over_every_code():
    grid = oracle.ue5m3_values()
    midpoints = (grid[:-1] + grid[1:]) / 2  # every tie, exact in fp32
    values = np.concatenate([grid, midpoints, np.nextafter(midpoints.astype(np.float32), np.float32(0)),
                             np.nextafter(midpoints.astype(np.float32), np.float32(np.inf)),
                             np.random.default_rng(0).uniform(0, 1.3e5, 4000), [2e5, 3e38, 0.0, 1e-40]])
    values = values.astype(np.float32)
    rounded = elements.round_ue5m3(torch.from_numpy(values.copy()))
    expected = oracle.ue5m3_brute_force(values)
    assert np.array_equal(rounded.numpy(), expected), np.flatnonzero(rounded.numpy() != expected)[:5]
    codes = elements.ue5m3_codes(torch.from_numpy(grid.astype(np.float32)))
    assert torch.equal(codes, torch.arange(255, dtype=torch.uint8))  # the codes are the search's indices
    assert torch.equal(elements.ue5m3_values(codes), torch.from_numpy(grid.astype(np.float32)))
    assert elements.round_ue5m3(torch.tensor([float("nan")])).isnan().all()


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 3e4])
def test_nvfp4_ue5m3_matches_the_oracle(tile, dtype, scale):
    x = oracle.fresh_input(64, 96, scale, dtype)
    x[5, :16] *= 1e-6  # a block far below the tensor's amax: E4M3 would flush its scale, UE5M3 keeps it
    quantized = quantize(x, "nvfp4_ue5m3", tile=tile)
    expected = oracle.nvfp4_ue5m3(oracle.to_numpy_f32(x), tile)
    assert np.array_equal(quantized.codes.numpy(), expected["codes"])
    assert np.array_equal(quantized.block_scales_fp32()[:, 0, :, 0].numpy(), expected["s_b"])
    assert quantized.tensor_scale.item() == expected["decode"]
    assert np.array_equal(quantized.scaled_values(torch.float32).numpy(), expected["scaled"])
