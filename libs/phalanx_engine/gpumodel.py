"""Whether a GPU model can serve a pod's request at all, whatever is free on it: the node-side
rules (R3/R5) — the vendor hint, whole GPUs only on AMD, a MIG profile of the model for a
``gpu-slice`` request, no more GPU memory than the model has. ``phalanx validate --gpu-model``
names them for a pod before it is created. Pure.
"""

from __future__ import annotations

from phalanx_engine import mig
from phalanx_kubeobjects.requests import GpuRequest
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.events import RequestKind
from phalanx_proto.kubeapi import GPU_CORE, GPU_MEMORY, GPU_SLICE, VENDOR_ANNOTATION


def check_gpu_model(
    request: GpuRequest, model: str, *, vendor: str = "nvidia", memory_mib: int = 0
) -> tuple[Violation, ...]:
    """Node-side rules: can a GPU of ``model`` (``vendor``, ``memory_mib`` total) serve the
    request? Empty when it can; otherwise the violations, for the pod's pending reason."""
    out: list[Violation] = []
    if request.vendor and request.vendor != vendor:
        out.append(Violation(f"metadata.annotations[{VENDOR_ANNOTATION}]", request.vendor,
                             f"the GPU is a {vendor} {model}"))
    if request.kind in (RequestKind.TDM, RequestKind.MIG) and vendor == "amd":
        field, value = (GPU_SLICE, str(request.mig_slices)) if request.mig_slices else (
            (GPU_CORE, str(request.core_pct)) if request.core_pct else (GPU_MEMORY, f"{request.memory_mib} MiB"))
        out.append(Violation(field, value, f"AMD GPUs ({model}) take whole-GPU requests only (seed 3.5)"))
    if request.kind is RequestKind.MIG and vendor != "amd":
        slices = str(request.mig_slices)
        table = mig.mig_table(model, memory_mib)
        if not mig.mig_capable(model) or vendor != "nvidia":
            out.append(Violation(GPU_SLICE, slices,
                                 f"GPU model {model!r} does not support MIG; MIG needs a MIG-capable NVIDIA "
                                 "model such as A100, A30, H100, H800, H200 or B200 (seed: A100 and H800)"))
        elif table is None:
            out.append(Violation(GPU_SLICE, slices, f"Phalanx has no MIG profile table for {model!r}, so it "
                                                    "cannot choose a MIG profile and slot on it"))
        elif mig.profile_for(table, request.mig_slices, request.memory_mib) is None:
            names = ", ".join(p.name for p in table.profiles)
            out.append(Violation(GPU_SLICE, f"{slices} with {request.memory_mib} MiB",
                                 f"{table.model} has no MIG profile with {slices} compute slices and that much "
                                 f"memory; its profiles are {names}"))
    if request.kind is RequestKind.TDM and memory_mib and request.memory_mib > memory_mib:
        out.append(Violation(GPU_MEMORY, f"{request.memory_mib} MiB",
                             f"more GPU memory than a {model} has ({memory_mib} MiB)"))
    return tuple(out)
