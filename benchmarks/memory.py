"""Where a training step's GPU memory goes: weights, gradients, optimizer states, activations.

The first four are counted from the tensors themselves (exact, any device); activations are what a
forward+backward adds on top at its peak, measured with the CUDA allocator's counters:

    activations = max_allocated during fwd+bwd - allocated before it - gradient bytes it created

(grads are created during backward while activations are being freed, so this is the peak of
activations and temporaries net of the gradients; an upper bound on neither alone). Megatron-Core's
22.0 GiB for the slice is BF16 weights, no optimizer: compare weights + activations with it.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable

import torch
import torch.nn as nn

GIB = 2**30


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct storages (a tensor and a view of it count once)."""
    seen, total = set(), 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def tensor_memory(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, float]:
    """GiB held by the model's parameters (by dtype), buffers, gradients and the optimizer's states."""
    parameters = list(model.parameters())
    memory = {}
    for dtype in sorted({p.dtype for p in parameters}, key=str):
        memory[f"weights_{str(dtype).removeprefix('torch.')}"] = _bytes(p for p in parameters if p.dtype == dtype) / GIB
    memory["buffers"] = _bytes(model.buffers()) / GIB
    memory["gradients"] = _bytes(p.grad for p in parameters if p.grad is not None) / GIB
    states = (value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value))
    memory["optimizer_states"] = _bytes(states) / GIB
    return memory


def activation_peak(fwd_bwd: Callable[[], object], model: nn.Module) -> float:
    """GiB of activations and temporaries at the peak of one CUDA fwd+bwd, net of the gradients it creates.

    Gradients must be None before the call (zero_grad(set_to_none=True)); they are left in place.
    """
    parameters = list(model.parameters())
    if any(p.grad is not None for p in parameters):
        raise ValueError("activation_peak needs gradients set to None first (optimizer.zero_grad(set_to_none=True))")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    gradients = _bytes(p.grad for p in parameters if p.grad is not None)
    return (torch.cuda.max_memory_allocated() - before - gradients) / GIB
