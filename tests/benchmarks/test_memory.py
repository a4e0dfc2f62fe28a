"""benchmarks.memory counts each kind of tensor once, from the tensors (CPU; the CUDA peak is GPU-only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from benchmarks.memory import GIB, activation_peak, tensor_memory


def test_tensor_memory_of_adamw_after_a_step():
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 32, bias=False))
    model.register_buffer("table", torch.zeros(10, dtype=torch.float64))
    weights = (64 * 128 + 128 + 128 * 32) * 4
    optimizer = torch.optim.AdamW(model.parameters())
    memory = tensor_memory(model, optimizer)
    assert memory == {"weights_float32": weights / GIB, "buffers": 80 / GIB, "gradients": 0.0, "optimizer_states": 0.0}
    model(torch.randn(3, 64)).sum().backward()
    optimizer.step()
    memory = tensor_memory(model, optimizer)
    assert memory["gradients"] == weights / GIB
    # exp_avg and exp_avg_sq per parameter (fp32, the parameter's size) + one 4-byte step per parameter
    assert memory["optimizer_states"] == (2 * weights + 3 * 4) / GIB


def test_tensor_memory_counts_a_shared_weight_once_and_splits_dtypes():
    first = nn.Linear(16, 16, bias=False)
    second = nn.Linear(16, 16, bias=False)
    second.weight = first.weight  # tied
    model = nn.ModuleList([first, second, nn.Linear(16, 16, bias=False).bfloat16()])
    memory = tensor_memory(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert memory["weights_float32"] == 16 * 16 * 4 / GIB
    assert memory["weights_bfloat16"] == 16 * 16 * 2 / GIB


def test_activation_peak_refuses_existing_gradients():
    model = nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(ValueError, match="set_to_none"):
        activation_peak(lambda: None, model)
