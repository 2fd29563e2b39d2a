"""Peak dense matrix throughput per GPU model: the denominator of MFU (model FLOPs utilisation).

MFU = the FLOP/s of the model's own arithmetic (what one training step computes, recomputation not
counted) on one device / that device's peak for the precision it trains in. The peaks are NVIDIA's
datasheet figures for dense math (the tensor-core figures NVIDIA headlines assume 2:4 sparsity: half of
them), at the datasheet's clocks and power; fp32 is the plain (non-tensor-core) rate, which is what torch's
fp32 matmuls run at unless TF32 is allowed. A GPU this table does not know has no MFU ("n/a"), never 0.
Looked up by the name NVML gives the GPU (nvmlDeviceGetName, e.g. "NVIDIA H100 80GB HBM3"); pure Python,
no NVML import (the exporter and the trainer pass the name they have).
"""

from __future__ import annotations

H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5, PCIe, NVL)"
H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM, NVL)"
A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe alike for these rates)"
L40S = "NVIDIA L40S GPU datasheet"
BLACKWELL = "NVIDIA Blackwell datasheet: HGX B200 at 1000 W, GB200 at 1200 W"

# (words that must all be in NVML's name, upper-cased; the model; TFLOP/s by precision; source), the first
# row that matches decides (a PCIe or NVL part before its SXM sibling).
MODELS: tuple[tuple[tuple[str, ...], str, dict[str, float], str], ...] = (
    (("H100", "PCIE"), "H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2}, H100),
    (("H100", "NVL"), "H100 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}, H100),
    (("H100",), "H100 SXM", {"bf16": 989.5, "fp16": 989.5, "fp32": 66.9}, H100),
    (("H200", "NVL"), "H200 NVL", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}, H200),
    (("H200",), "H200 SXM", {"bf16": 989.5, "fp16": 989.5, "fp32": 66.9}, H200),
    (("A100",), "A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, A100),
    (("L40S",), "L40S", {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6}, L40S),
    (("GB200",), "GB200", {"bf16": 2500.0, "fp16": 2500.0, "fp32": 90.0}, BLACKWELL),
    (("B200",), "B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0}, BLACKWELL),
)

# Lightning's and torch's spellings of a precision -> the table's.
PRECISIONS = {
    "bf16": ("bf16-mixed", "bf16-true", "bf16", "torch.bfloat16", "bfloat16"),
    "fp16": ("16-mixed", "16-true", "16", "fp16", "torch.float16", "float16", "half"),
    "fp32": ("32-true", "32", "fp32", "torch.float32", "float32", "float"),
}


def precision_of(text: str | None) -> str | None:
    """The table's precision for ``text`` (Lightning's ``bf16-mixed``, torch's ``torch.bfloat16``, …); None
    for one it has no peak for (fp64, fp8, …)."""
    text = str(text or "").strip().lower()
    return next((p for p, names in PRECISIONS.items() if text in names), None)


def model_of(gpu_name: str | None) -> tuple[str, dict[str, float], str] | None:
    """(model, peaks, source) for NVML's name of a GPU; None for one the table does not know."""
    words = str(gpu_name or "").upper()
    for needed, model, peaks, source in MODELS:
        if all(w in words for w in needed):
            return model, peaks, source
    return None


def peak_tflops(gpu_name: str | None, precision: str | None) -> float | None:
    """The dense peak TFLOP/s of ``gpu_name`` at ``precision`` (any spelling :func:`precision_of` takes);
    None when either is unknown."""
    known, p = model_of(gpu_name), precision_of(precision)
    return known[1].get(p) if known and p else None


def mfu(tflops: float | None, gpu_name: str | None, precision: str | None) -> float | None:
    """Achieved TFLOP/s as a fraction of the peak (0.41: 41 %); None ("n/a") on a CPU, an unknown GPU or
    precision, or without a measurement."""
    peak = peak_tflops(gpu_name, precision)
    if tflops is None or peak is None or not tflops >= 0:
        return None
    return tflops / peak
