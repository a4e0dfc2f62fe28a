"""Dense peak rates of the GPUs we plan for, per GEMM input format.

Numbers are the vendors' datasheet dense (non-sparse) tensor-core peaks, per GPU, in FLOP/s,
and HBM bandwidth in bytes/s. MFU divides model FLOPs by the BF16 peak, whatever format the
GEMMs ran in (the convention of the NVFP4 paper and Megatron), so a faster format shows as
higher MFU.

Sources (datasheets, dense figures; sparse figures are 2x these):
- H100 SXM / H200 SXM: NVIDIA H100 and H200 Tensor Core GPU datasheets: BF16 989.4 TF,
  FP8 1978.9 TF; HBM 3.35 TB/s (H100), 4.8 TB/s (H200). No FP4 or MX formats in hardware.
- B200 (HGX B200, per GPU): NVIDIA Blackwell datasheet: BF16 2.25 PF, FP8/MXFP8 4.5 PF,
  NVFP4 9 PF; HBM3e 8 TB/s.
- GB200 (per Blackwell GPU in GB200 NVL72): BF16 2.5 PF, FP8/MXFP8 5 PF, NVFP4 10 PF; 8 TB/s.
- B300 (HGX B300, per GPU) / GB300 (per GPU in GB300 NVL72), Blackwell Ultra: the FP4 rate
  grows 1.5x over Blackwell (B300 13.5 PF, GB300 15 PF dense NVFP4) while BF16 and FP8 stay at
  Blackwell's (B300 2.25 / 4.5 PF, GB300 2.5 / 5 PF); HBM3e 8 TB/s.
Measured ceilings on an H200 (docs/performance.md): BF16 GEMM 660-820 TF at 12B shapes, FP8 blockwise 1282.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: Dict[str, float]  # format -> dense FLOP/s; a missing format has no native GEMM
    hbm_bytes_per_s: float


GPUS: Dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", {"bf16": 989.4 * TERA, "fp8": 1978.9 * TERA}, 3.35 * TERA),
    "H200": GpuSpec("H200", {"bf16": 989.4 * TERA, "fp8": 1978.9 * TERA}, 4.8 * TERA),
    "B200": GpuSpec("B200", {"bf16": 2250 * TERA, "fp8": 4500 * TERA, "mxfp8": 4500 * TERA, "nvfp4": 9000 * TERA}, 8.0 * TERA),
    "GB200": GpuSpec("GB200", {"bf16": 2500 * TERA, "fp8": 5000 * TERA, "mxfp8": 5000 * TERA, "nvfp4": 10000 * TERA}, 8.0 * TERA),
    "B300": GpuSpec("B300", {"bf16": 2250 * TERA, "fp8": 4500 * TERA, "mxfp8": 4500 * TERA, "nvfp4": 13500 * TERA}, 8.0 * TERA),
    "GB300": GpuSpec("GB300", {"bf16": 2500 * TERA, "fp8": 5000 * TERA, "mxfp8": 5000 * TERA, "nvfp4": 15000 * TERA}, 8.0 * TERA),
}


def detect_gpu(device: Optional[torch.device] = None) -> Optional[GpuSpec]:
    """The spec of the present CUDA GPU, matched by name ('NVIDIA H200' -> H200); None if unknown."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device).upper()
    # Longest key first so 'GB200' is not taken for 'B200'.
    for key in sorted(GPUS, key=len, reverse=True):
        if key in name:
            return GPUS[key]
    return None


def bf16_peak_flops(device: Optional[torch.device] = None) -> Optional[float]:
    """Dense BF16 peak of the present GPU (the MFU denominator), None on CPU or unknown GPUs."""
    spec = detect_gpu(device)
    return spec.peak_flops["bf16"] if spec else None
