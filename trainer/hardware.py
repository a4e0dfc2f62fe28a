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
Measured ceilings on our H200 (docs/performance.md): BF16 GEMM 700-820 TF at 12B shapes, FP8 blockwise 1260-1340.

Memory and links per GPU (what the run planner, trainer/planning, needs), datasheet figures:
- HBM capacity: H100 SXM 80 GB, H200 141 GB (NVIDIA H100/H200 datasheets); B200 180 GB (DGX B200:
  1,440 GB for 8 GPUs); GB200 186 GB (GB200 NVL72: 13.4 TB for 72 GPUs); B300 288 GB (HGX B300: 2.3 TB
  for 8); GB300 288 GB (GB300 NVL72 datasheet: 288 GB HBM3e per Blackwell Ultra GPU). The datasheets'
  GB are what the devices report in GiB (an H200 reports 140.4 GiB), so they are used as GiB.
- NVLink per GPU and direction: NVLink 4 (H100, H200) 900 GB/s both ways = 450 GB/s each way; NVLink 5
  (B200, GB200, B300, GB300) 1.8 TB/s = 900 GB/s each way (NVIDIA NVLink page). One NVLink domain is
  one HGX board of 8 GPUs, or one NVL72 rack of 72 (GB200 NVL72, GB300 NVL72).
- InfiniBand per GPU and direction (one NIC per GPU in the reference designs): ConnectX-7 NDR
  400 Gb/s = 50 GB/s (DGX H100, DGX H200, DGX B200, GB200 NVL72 compute trays); ConnectX-8 800 Gb/s =
  100 GB/s (HGX B300, GB300 NVL72 compute trays: 4 ConnectX-8 per 4-GPU tray).
The CPU (`cpu_spec`) is this host: its cores at a nominal 32 FP32 FLOP per cycle and core (two
256-bit FMA units) and 3 GHz, 10 GB/s of memory bandwidth per core, 5 GB/s between processes (gloo
over the loopback), and the host's RAM; a rough bound for planning only (the trainer computes in
float32 on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

TERA = 1e12


GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: Dict[str, float]  # format -> dense FLOP/s; a missing format has no native GEMM
    hbm_bytes_per_s: float
    memory_gib: float = 0.0
    """Device memory (HBM; the host's RAM for the CPU)."""
    nvlink_bytes_per_s: float = 0.0
    """NVLink bandwidth per GPU in one direction (0: none)."""
    nvlink_domain: int = 1
    """GPUs one NVLink domain joins (8 on an HGX board, 72 in an NVL72 rack)."""
    network_bytes_per_s: float = 0.0
    """Scale-out (InfiniBand) bandwidth per GPU in one direction."""
    capability: Optional[Tuple[int, int]] = None
    """CUDA compute capability (9.0 Hopper, 10.0 Blackwell): which quantized GEMM backends run natively."""


_HOPPER = {"bf16": 989.4 * TERA, "fp8": 1978.9 * TERA}
_NVLINK4, _NVLINK5 = 450e9, 900e9  # bytes/s per GPU and direction
_CX7, _CX8 = 50e9, 100e9  # InfiniBand per GPU and direction: 400 and 800 Gb/s


def _blackwell(bf16: float, fp4: float) -> Dict[str, float]:
    return {"bf16": bf16 * TERA, "fp8": 2 * bf16 * TERA, "mxfp8": 2 * bf16 * TERA, "nvfp4": fp4 * TERA}


GPUS: Dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", _HOPPER, 3.35 * TERA, 80, _NVLINK4, 8, _CX7, (9, 0)),
    "H200": GpuSpec("H200", _HOPPER, 4.8 * TERA, 141, _NVLINK4, 8, _CX7, (9, 0)),
    "B200": GpuSpec("B200", _blackwell(2250, 9000), 8.0 * TERA, 180, _NVLINK5, 8, _CX7, (10, 0)),
    "GB200": GpuSpec("GB200", _blackwell(2500, 10000), 8.0 * TERA, 186, _NVLINK5, 72, _CX7, (10, 0)),
    "B300": GpuSpec("B300", _blackwell(2250, 13500), 8.0 * TERA, 288, _NVLINK5, 8, _CX8, (10, 3)),
    "GB300": GpuSpec("GB300", _blackwell(2500, 15000), 8.0 * TERA, 288, _NVLINK5, 72, _CX8, (10, 3)),
}


def host_memory_gib() -> float:
    """This host's physical RAM."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def cpu_spec(cores: Optional[int] = None, memory_gib: Optional[float] = None) -> GpuSpec:
    """This host as a device to plan for (the module docstring's nominal rates)."""
    import os

    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rate = cores * 32 * 3e9
    memory = memory_gib if memory_gib is not None else host_memory_gib()
    # Processes of one host exchange tensors through gloo over the loopback: a nominal 5 GB/s.
    return GpuSpec("CPU", {"bf16": rate}, cores * 10e9, memory, network_bytes_per_s=5e9)


def device_spec(name: str) -> GpuSpec:
    """GPUS[name], or this host for 'CPU' (case-insensitive); ValueError naming the known ones."""
    key = name.upper()
    if key == "CPU":
        return cpu_spec()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}, CPU")
    return GPUS[key]


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
