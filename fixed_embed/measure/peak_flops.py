"""Peak dense FLOP/s per accelerator and dtype, for MFU, from NVIDIA's datasheets (Lightning's
``get_available_flops`` gives the H200's *sparse* ones, halving every MFU); unknown devices get
None: no MFU beats a wrong one."""

from __future__ import annotations

from typing import Any

import torch

from fixed_embed.distributed.fsdp import shards_parameters

_HOPPER_SXM = {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
_HOPPER_NVL = {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12}
# chip -> {dtype name: FLOP/s}. Matched against torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200 nvl": _HOPPER_NVL,
    "h200": _HOPPER_SXM,
    "h100 nvl": _HOPPER_NVL,
    "h100 pcie": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12},
    "h100": _HOPPER_SXM,  # "H100 80GB HBM3"
    "a100": {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12},
    "l40s": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.0e12, "fp32": 91.6e12},
}


def dtype_name(dtype: torch.dtype) -> str:
    """bf16, fp16, tf32 (fp32 matmuls when torch may use TF32), fp32 or fp64."""
    if dtype == torch.float32:
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}[dtype]


def training_matmul_dtype(trainer: Any, module: Any) -> str:
    """Dtype of a ``Trainer``'s training matmuls: autocast's, else (sharded) FSDP2's
    param_dtype, else the weights'."""
    device_type = module.device.type
    with trainer.precision_plugin.forward_context():
        if torch.is_autocast_enabled(device_type):
            return dtype_name(torch.get_autocast_dtype(device_type))
    parallel = getattr(module, "parallel_config", None)
    if shards_parameters(trainer.strategy) and parallel is not None:
        return dtype_name(getattr(torch, parallel.param_dtype))
    weight = next((m.weight for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
    return dtype_name(weight.dtype if weight is not None else torch.float32)


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Dense peak FLOP/s of one ``device`` in ``dtype`` (bf16, fp16, tf32, fp32), or None if
    unknown."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((table.get(dtype) for chip, table in PEAK_FLOPS.items() if chip in name), None)
