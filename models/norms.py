"""RMSNorm and the Mamba-2 gated grouped RMSNorm.

RMSNorm (block pre-norms and the final norm; Hugging Face ``NemotronHRMSNorm``):

    y = weight * x / sqrt(mean(x^2) + eps)       computed in fp32, cast back to x's dtype

Gated grouped RMSNorm (Mamba-2 output norm, ``norm_before_gate=False`` as Megatron,
mamba_ssm ``RMSNormGated`` and Hugging Face ``NemotronHRMSNormGated`` use it): gate first,
then normalise each group of ``group_size`` consecutive channels separately:

    u = x * silu(z)
    y[g] = weight[g] * u[g] / sqrt(mean(u[g]^2) + eps)      for each group g

computed in fp32 and cast to x's dtype (mamba_ssm's kernel does the same). On CUDA,
mamba_ssm's Triton ``rmsnorm_fn`` runs it (one fused pass forward and backward) when
``backend`` resolves to 'triton'; ``gated_rms_norm_reference`` is the torch path and the
reference the kernel is tested against.

Under tensor parallelism (trainer/tensor_parallel.py) a weight may be a DTensor: a block norm's is
replicated and normalises the rank's share of the tokens, the gated norm's is the rank's groups.
Both compute with ``local_tensor(weight)``, the rank's own values (differentiable).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.kernels import mamba_ssm_triton, resolve_backend

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without torch.distributed: no DTensor can exist
    DTensor = ()


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's values of a DTensor parameter (``to_local()``, differentiable); any other tensor as is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension with a learned scale (no bias)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size))

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = local_tensor(self.weight)
        if x.dtype == torch.float32 and weight.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.eps)
        # Low-precision activations: normalise and scale in fp32, then cast back.
        return F.rms_norm(x.float(), weight.shape, weight.float(), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def gated_rms_norm_reference(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float
) -> torch.Tensor:
    """Torch gated grouped RMSNorm. x, gate: (..., D); weight: (D,) -> (..., D) in x's dtype."""
    u = x.float() * F.silu(gate.float())
    grouped = u.unflatten(-1, (-1, group_size))  # (..., D / group_size, group_size)
    normed = grouped * torch.rsqrt(grouped.square().mean(dim=-1, keepdim=True) + eps)
    return (normed.flatten(-2) * weight.float()).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Gated grouped RMSNorm of the Mamba-2 mixer: norm(x * silu(gate)) per group, then scale."""

    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-5, backend: str = "auto"):
        super().__init__()
        if hidden_size % group_size != 0:
            raise ValueError(f"GatedRMSNorm: group_size {group_size} must divide hidden_size {hidden_size}")
        self.eps = eps
        self.group_size = group_size
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(hidden_size))

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x: (..., D) SSM output; gate: (..., D) (z, may be a strided view of in_proj's output)."""
        weight = local_tensor(self.weight)  # under tensor parallelism: this rank's groups
        if resolve_backend(self.backend, x.device, "gated_norm_backend") == "triton":
            return mamba_ssm_triton.gated_rmsnorm(
                x, weight, None, z=gate, eps=self.eps, group_size=self.group_size, norm_before_gate=False
            )
        return gated_rms_norm_reference(x, gate, weight, self.group_size, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, group_size={self.group_size}, eps={self.eps}, backend={self.backend}"
