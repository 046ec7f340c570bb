"""What each container of a pod asks of the GPU resources: the resource names Phalanx reads,
each value's bound and rule (``MOST``, one ``Violation`` per broken rule), and what one container
may combine (whole GPUs or one share; TDM or MIG; memory once). Init containers may ask for
none. Part of ``requests.parse_pod``, which holds the pod-level rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phalanx_kubeobjects.quantity import Bound, count
from phalanx_kubeobjects.violations import Violation, as_map, name_of, shown_value
from phalanx_proto.kubeapi import (
    ALIYUN_GPU,
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_MIB,
    GPU_MEMORY_MIB_UNIT,
    GPU_SLICE,
    NVIDIA_GPU,
    RDMA,
)

SLICE_VALUES = (1, 2, 3, 4, 7)
WHOLE_RESOURCES = (NVIDIA_GPU, ALIYUN_GPU)
SHARE_RESOURCES = (GPU_CORE, GPU_MEMORY, GPU_MEMORY_MIB, GPU_SLICE)
RESOURCES = (*WHOLE_RESOURCES, *SHARE_RESOURCES, RDMA)
MAX_GPUS = Bound(64, "a pod's GPUs are on one node, and no node has more than 64 GPUs")
MAX_GPU_MEMORY_GIB = 1024
MOST: Mapping[str, Bound] = {
    NVIDIA_GPU: MAX_GPUS,
    ALIYUN_GPU: MAX_GPUS,
    GPU_CORE: Bound(100, "gpu-core is a percent of one GPU's compute"),
    GPU_MEMORY: Bound(MAX_GPU_MEMORY_GIB, "gpu-memory is GiB of one GPU's memory, and no GPU has more than 1 TiB "
                                          "(4 GiB is written \"4\", not \"4Gi\")"),
    GPU_MEMORY_MIB: Bound(MAX_GPU_MEMORY_GIB * 1024, "gpu-memory-mib is MiB of one GPU's memory, and no GPU has more "
                                                     "than 1 TiB"),
    GPU_SLICE: Bound(max(SLICE_VALUES), "gpu-slice must be one of 1, 2, 3, 4, 7 (MIG compute slices)"),
    RDMA: Bound(1, "aliyun.com/rdma is a switch, not a NIC count: set it to \"1\" to place GPUs and RDMA NICs "
                   "together, or leave it out"),
}
"""The upper bound of every resource Phalanx reads, with its rule."""


Container = tuple[str, dict[str, int], Mapping[str, Any]]  # name, valid asks, the container


def containers(spec: Mapping[str, Any], v: list[Violation]) -> list[Container]:
    """Each main container's name, its valid asks and the container; violations for the values
    and combinations it may not ask, for init containers that ask at all, and for a spec
    without containers."""
    mains = spec.get("containers")
    if not isinstance(mains, list) or not mains:
        v.append(Violation("spec.containers", shown_value(mains), "a pod needs at least one container"))
        mains = []
    inits = spec.get("initContainers") or []
    if not isinstance(inits, list):
        v.append(Violation("spec.initContainers", shown_value(inits), "must be a list of containers"))
        inits = []
    for section, items in (("containers", mains), ("initContainers", inits)):
        v.extend(Violation(f"spec.{section}[{i}]", shown_value(c), "must be a container (a mapping)")
                 for i, c in enumerate(items) if not isinstance(c, Mapping))
    for i, c in enumerate(inits):
        cname = name_of(c, i)
        for key in _asks(c, cname, "initContainers", v):
            v.append(Violation(f"spec.initContainers[{cname}].resources.limits[{key}]", shown_value(_limit(c, key)),
                               "init containers cannot ask for GPU resources; ask in the main containers"))
    per = []
    for i, c in enumerate(mains):
        cname = name_of(c, i)
        asks = _asks(c, cname, "containers", v)
        _check_container(cname, asks, v)
        per.append((cname, asks, as_map(c)))
    return per


def _limit(c: Any, key: str) -> Any:
    res = as_map(as_map(c).get("resources"))
    return as_map(res.get("limits")).get(key, as_map(res.get("requests")).get(key))


def _value_rule(key: str, n: int) -> str:
    """The rule ``n`` breaks for resource ``key``, or '' when it is fine."""
    if key in WHOLE_RESOURCES and n < 1:
        return f"{key} is a number of whole GPUs and must be at least 1 (leave it out to ask for none)"
    if key == GPU_CORE and n == 0:
        return ("gpu-core 0 is not allowed: it would make the GPU program in the container hang without output "
                "(seed FAQ Q1); give a percent from 1 to 100, or leave gpu-core out for no compute limit")
    if key == GPU_MEMORY and n < 1:
        return "gpu-memory is GiB of GPU memory and must be at least 1 (for less, use aliyun.com/gpu-memory-mib)"
    if key == GPU_MEMORY_MIB and (n < GPU_MEMORY_MIB_UNIT or n % GPU_MEMORY_MIB_UNIT):
        lower = max(GPU_MEMORY_MIB_UNIT, n // GPU_MEMORY_MIB_UNIT * GPU_MEMORY_MIB_UNIT)
        upper = max(GPU_MEMORY_MIB_UNIT, -(-n // GPU_MEMORY_MIB_UNIT) * GPU_MEMORY_MIB_UNIT)
        near = f"{lower}" if lower == upper else f"{lower} or {upper}"
        return (f"gpu-memory-mib must be a positive multiple of {GPU_MEMORY_MIB_UNIT} MiB (the MiB granularity, "
                f"seed 3.5); the nearest allowed: {near}")
    if key == GPU_SLICE and n not in SLICE_VALUES:
        return "gpu-slice must be one of 1, 2, 3, 4, 7 (MIG compute slices)"
    if key == RDMA and n != 1:
        return MOST[RDMA].rule
    return ""


def _asks(c: Any, cname: str, section: str, v: list[Violation]) -> dict[str, int]:
    """The valid Phalanx resources one container asks for; violations for the rest."""
    res = as_map(as_map(c).get("resources"))
    limits, requests = as_map(res.get("limits")), as_map(res.get("requests"))
    asks: dict[str, int] = {}
    for key in RESOURCES:
        lfield = f"spec.{section}[{cname}].resources.limits[{key}]"
        rfield = f"spec.{section}[{cname}].resources.requests[{key}]"
        if key not in limits:
            if key in requests:
                v.append(Violation(rfield, shown_value(requests[key]),
                                   "must be set in resources.limits; Kubernetes does not overcommit extended "
                                   "resources, so requests may only repeat the limit"))
            continue
        raw = limits[key]
        n = count(raw, lfield, most=MOST[key])
        if isinstance(n, Violation):
            v.append(n)
            continue
        if key in requests and count(requests[key], rfield, most=MOST[key]) != n:
            v.append(Violation(rfield, shown_value(requests[key]), f"must equal the limit ({shown_value(raw)}) or be left out"))
        rule = _value_rule(key, n)
        if rule:
            v.append(Violation(lfield, shown_value(raw), rule))
            continue
        asks[key] = n
    return asks


def _check_container(cname: str, asks: Mapping[str, int], v: list[Violation]) -> None:
    path = f"spec.containers[{cname}].resources.limits"
    whole = next((k for k in WHOLE_RESOURCES if k in asks), None)

    def both(*keys: str) -> str:
        return ", ".join(f"{k}={asks[k]}" for k in keys)

    if whole:
        for key, what in ((GPU_CORE, "a whole GPU has no compute limit; leave gpu-core out (seed 3.2)"),
                          (GPU_MEMORY, "a whole GPU comes with all its memory; leave gpu-memory out"),
                          (GPU_MEMORY_MIB, "a whole GPU comes with all its memory; leave gpu-memory-mib out"),
                          (GPU_SLICE, "a MIG slice is part of one GPU; ask for one or the other")):
            if key in asks:
                v.append(Violation(path, both(whole, key),
                                   f"{key} cannot be combined with a whole-GPU request ({whole}): {what}"))
    if GPU_CORE in asks and GPU_SLICE in asks:
        v.append(Violation(path, both(GPU_CORE, GPU_SLICE),
                           "TDM (gpu-core) and MIG (gpu-slice) cannot be combined: they never share a GPU "
                           "(seed 3.5); ask for one or the other"))
    if GPU_MEMORY in asks and GPU_MEMORY_MIB in asks:
        v.append(Violation(path, both(GPU_MEMORY, GPU_MEMORY_MIB),
                           "give GPU memory once: aliyun.com/gpu-memory in GiB or aliyun.com/gpu-memory-mib "
                           "in MiB"))


def is_whole(asks: Mapping[str, int]) -> bool:
    return any(k in asks for k in WHOLE_RESOURCES)


def is_share(asks: Mapping[str, int]) -> bool:
    return any(k in asks for k in SHARE_RESOURCES)


Share = tuple[int, int, int]  # core percent, memory MiB, MIG slices (0 = not asked)


def share_of(asks: Mapping[str, int]) -> Share:
    memory = asks.get(GPU_MEMORY, 0) * 1024 or asks.get(GPU_MEMORY_MIB, 0)
    return (asks.get(GPU_CORE, 0), memory, asks.get(GPU_SLICE, 0))


def share_text(share: Share) -> str:
    core, memory, slices = share
    parts = ([f"gpu-core={core}"] if core else []) + ([f"gpu-slice={slices}"] if slices else [])
    parts += [f"memory={memory}MiB"] if memory else []
    return " ".join(parts) or "none"
