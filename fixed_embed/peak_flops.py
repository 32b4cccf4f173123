"""Peak dense FLOP/s per accelerator and dtype, for model FLOPs utilisation (MFU).

Dense tensor-core figures from NVIDIA's datasheets (the "with sparsity" figures halved). We keep
our own table because Lightning's ``get_available_flops`` lists the H200 with its *sparse*
figures (2.0e15 bf16), which would halve every MFU. Unknown devices (CPU included) get ``None``:
no MFU is better than a wrong one.
"""

from __future__ import annotations

import torch

__all__ = ["PEAK_FLOPS", "matmul_dtype", "peak_flops"]

# chip -> {dtype name: FLOP/s}. Matched against torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200 nvl": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12},
    "h200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},  # SXM
    "h100 nvl": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12},
    "h100 pcie": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12},
    "h100": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},  # SXM ("H100 80GB HBM3")
    "a100": {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12},
    "l40s": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.0e12, "fp32": 91.6e12},
}


def matmul_dtype(precision: str) -> str:
    """The dtype the matmuls run in under a Lightning ``precision`` setting."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith(("32", "64")):
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    raise ValueError(f"no matmul dtype known for precision {precision!r}")


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Dense peak FLOP/s of one ``device`` in ``dtype`` (bf16, fp16, tf32, fp32), or None if unknown."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    for chip, table in PEAK_FLOPS.items():
        if chip in name:
            return table.get(dtype)
    return None
