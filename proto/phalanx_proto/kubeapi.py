"""Phalanx's contract on Kubernetes objects: what a pod says to opt in and to ask for GPUs, and
what binder writes for the node (the assignment annotation on the pod, the fence Lease).

The other side of each is outside Phalanx's processes' memory, so it is wire contract like an
event: pods in users' YAML, the kubelet's device plugin reading the annotation and the fence,
other tools reading the annotation. Every reader and writer imports it from here (engine,
binder, gang-coordinator's reconciler, the device plugin, the Kubernetes port).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec

from phalanx_proto.codec import Decoder
from phalanx_proto.events import Assignment

# --- what a pod says -----------------------------------------------------------------------------
SCHEDULER_NAMES = ("phalanx", "lj-runtimekit-scheduler")
"""The ``spec.schedulerName`` values that hand a pod to Phalanx (the second for drop-in
compatibility)."""

NVIDIA_GPU = "nvidia.com/gpu"
"""Whole NVIDIA GPUs (the community name)."""
ALIYUN_GPU = "aliyun.com/gpu"
"""Whole GPUs of any vendor."""
GPU_CORE = "aliyun.com/gpu-core"
"""TDM: percent of one GPU's compute."""
GPU_MEMORY = "aliyun.com/gpu-memory"
"""TDM/MIG: GPU memory in GiB."""
GPU_MEMORY_MIB = "aliyun.com/gpu-memory-mib"
"""The same in MiB, in units of ``GPU_MEMORY_MIB_UNIT``."""
GPU_SLICE = "aliyun.com/gpu-slice"
"""MIG: compute slices of one GPU."""
RDMA = "aliyun.com/rdma"
"""``1``: place whole GPUs together with an RDMA NIC."""
GPU_MEMORY_MIB_UNIT = 128
"""``aliyun.com/gpu-memory-mib`` is a multiple of 128 MiB; the device plugin advertises one ID
per 128 MiB."""

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
"""``spec.preemptionPolicy`` (Kubernetes' default): the pod's gang may evict gangs of lower
priority (docs/preemption.md)."""
NEVER = "Never"
"""``spec.preemptionPolicy``: the pod's gang waits and never preempts. Also the Queue's
``spec.preemption.withinQueue``/``reclaim`` value that turns a rule off."""
PREEMPTION_POLICIES = (PREEMPT_LOWER_PRIORITY, NEVER)

# --- what binder writes on the pod ---------------------------------------------------------------
ASSIGNMENT_ANNOTATION = "phalanx.io/assignment"
"""The pod annotation holding its ``Assignment`` as JSON, written by binder with the Binding."""

_assignment_encoder = msgspec.json.Encoder()
_assignment_decoder = Decoder(Assignment)


def encode_assignment(a: Assignment) -> str:
    """The exact annotation text binder writes for ``a`` (its digest goes into the fence)."""
    return _assignment_encoder.encode(a).decode()


def decode_assignment(text: str) -> Assignment:
    """The assignment an annotation holds. Raises ``msgspec.DecodeError`` (not JSON) or
    ``msgspec.ValidationError`` (not an assignment)."""
    return _assignment_decoder.decode(text)


def assignment_digest(text: str) -> str:
    """``sha256:<hex>`` of the exact annotation text: what the fence records, so the device
    plugin serves only what binder wrote, never an annotation written or edited by anyone else."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- what binder writes for the node: the fence (docs/delivery.md) -----------------------------
FENCE_ANNOTATION = "phalanx.io/fence"
"""The annotation of the node's fence Lease (``phalanx-fence-<node>``) that holds its ``Fence``."""
MAX_FENCE_ENTRIES = 256
"""Pods one node's fence lists at most (bound, not yet admitted by the kubelet)."""


class FenceEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One pod binder bound to the node and the kubelet has not admitted yet."""

    uid: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    namespace: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    digest: Annotated[str, msgspec.Meta(pattern="^sha256:[0-9a-f]{64}$")]
    """``assignment_digest`` of the annotation binder wrote on the pod."""
    expires: float
    """Unix time after which the entry vouches for nothing."""
    batch: str = ""
    """The gang attempt (``<gang>#<attempt>``) the pod was bound in; informative."""


class Fence(msgspec.Struct, frozen=True, kw_only=True):
    """Every pod binder vouches for on ``node`` (phalanx_kube.fence reads and writes it)."""

    node: str
    pods: Annotated[tuple[FenceEntry, ...], msgspec.Meta(max_length=MAX_FENCE_ENTRIES)] = ()
    v: int = 1

    def entry(self, uid: str) -> FenceEntry | None:
        return next((e for e in self.pods if e.uid == uid), None)


_fence_encoder = msgspec.json.Encoder()
_fence_decoder = Decoder(Fence)


def encode_fence(fence: Fence) -> str:
    return _fence_encoder.encode(fence).decode()


def decode_fence(text: str) -> Fence:
    """Raises ``msgspec.DecodeError`` (not JSON) or ``msgspec.ValidationError`` (not a fence)."""
    return _fence_decoder.decode(text)
