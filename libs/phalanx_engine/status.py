"""Why a node cannot take a pod, as data: ``Status`` per plugin and node, ``NoFit`` per gang.

Every filter plugin answers a node with ``None`` (fits) or a ``Status``: the plugin's name,
whether waiting can help (``resolvable``: kube-scheduler's ``Unschedulable``; not resolvable:
``UnschedulableAndUnresolvable``) and one ``Reason`` or more, each with a stable ``code``, the
text kube-scheduler would count in its message (its own text for its own plugins) and, where
it is about an amount, the numbers: requested, free, capacity.

``NoFit`` keeps, per kind of member of the gang, every node's status, and prints them the way
kube-scheduler does: ``0/12 nodes are available: 4 Insufficient cpu, 8 no MIG-capable GPU.``
(one count per reason text, the "count text" strings sorted as strings, as kube-scheduler's
``FitError`` sorts them).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from phalanx_proto.events import PodRef


class Code(enum.StrEnum):
    """Stable reason codes (for metrics, tests and other programs; the texts are for people)."""

    NOT_ENABLED = "not-enabled"
    REPORT_INVALID = "node-report-invalid"
    NODE_ERROR = "node-evaluation-error"
    HEARTBEAT_STALE = "heartbeat-stale"
    NODE_STATE_NOT_REPORTED = "node-state-not-reported"
    NO_GPUS = "no-gpus"
    GPU_VENDOR = "gpu-vendor-mismatch"
    AMD_WHOLE_ONLY = "amd-whole-gpus-only"
    INSUFFICIENT_GPUS = "insufficient-gpus"
    GPU_UNHEALTHY = "gpu-unhealthy"
    INSUFFICIENT_GPU_CORE = "insufficient-gpu-core"
    INSUFFICIENT_GPU_MEMORY = "insufficient-gpu-memory"
    GPU_MEMORY_UNKNOWN = "gpu-memory-not-reported"
    NO_MIG_GPU = "no-mig-capable-gpu"
    MIG_NOT_ENABLED = "mig-not-enabled"
    NO_MIG_SLOT = "no-free-mig-slot"
    NO_RDMA_NIC = "no-rdma-nic"
    INSUFFICIENT_RESOURCE = "insufficient-resource"
    TOO_MANY_PODS = "too-many-pods"
    NODE_UNSCHEDULABLE = "node-unschedulable"
    UNTOLERATED_TAINT = "untolerated-taint"
    NODE_AFFINITY = "node-affinity-mismatch"
    NODE_NAME = "node-name-mismatch"
    NODE_PORTS = "host-ports-in-use"
    POD_AFFINITY = "pod-affinity-mismatch"
    POD_ANTI_AFFINITY = "pod-anti-affinity-mismatch"
    EXISTING_POD_ANTI_AFFINITY = "existing-pod-anti-affinity"
    POD_AFFINITY_REFUSED = "pod-affinity-not-supported"
    TOPOLOGY_SPREAD = "topology-spread-mismatch"
    TOPOLOGY_SPREAD_LABEL = "topology-spread-label-missing"
    GANG_DOMAIN = "gang-does-not-fit-one-domain"
    KEPT_FOR_GANG_AHEAD = "kept-for-gang-ahead"
    DRA_CANNOT_ALLOCATE = "dra-cannot-allocate"
    DRA_CLAIM_NOT_ON_NODE = "dra-claim-not-on-node"
    DRA_CLASS_MISSING = "dra-device-class-missing"
    DRA_ERROR = "dra-error"


class Reason(msgspec.Struct, frozen=True):
    """One cause. ``text`` is what the summary counts; the numbers are set for amounts
    (``resource`` names what they count: ``cpu`` in millicores, ``memory`` in bytes,
    ``gpus``, ``gpu-core`` in percent, ``gpu-memory`` in MiB, ...); ``detail`` is extra context
    the summary does not show (the untolerated taint, the conflicting port)."""

    code: Code
    text: str
    resource: str = ""
    requested: int = 0
    free: int = 0
    capacity: int = 0
    detail: str = ""


class Status(msgspec.Struct, frozen=True):
    """A plugin's verdict on one node: it does not fit, and why."""

    plugin: str
    reasons: tuple[Reason, ...]
    resolvable: bool = True
    """True: the pod may fit once other pods leave (kube-scheduler ``Unschedulable``); False:
    waiting cannot help (``UnschedulableAndUnresolvable``)."""

    @property
    def code(self) -> Code:
        return self.reasons[0].code

    @property
    def kube_code(self) -> str:
        return "Unschedulable" if self.resolvable else "UnschedulableAndUnresolvable"


def refuse(plugin: str, code: Code, text: str, *, resolvable: bool, resource: str = "", requested: int = 0,
           free: int = 0, capacity: int = 0, detail: str = "") -> Status:
    """A one-reason ``Status`` (the common case); the keywords are ``Reason``'s."""
    return Status(plugin, (Reason(code, text, resource, requested, free, capacity, detail),), resolvable)


@dataclass(frozen=True, slots=True)
class MemberFailure:
    """Why members of one kind (the same request) found no place: every node's status.
    ``what`` names them for people (``2 pods asking MIG 3 slices``)."""

    members: tuple[PodRef, ...]
    statuses: Mapping[str, Status]
    what: str = ""

    def histogram(self) -> Counter:
        """Reason text → number of nodes with that reason (each node counts once per text)."""
        counts: Counter = Counter()
        for status in self.statuses.values():
            counts.update({r.text for r in status.reasons})
        return counts

    def line(self, total: int) -> str:
        parts = sorted(f"{n} {text}" for text, n in self.histogram().items())
        return f"0/{total} nodes are available" + (f": {', '.join(parts)}" if parts else "")


@dataclass(frozen=True, slots=True)
class NoFit:
    """The gang does not fit: per kind of member, every node's status; ``detail`` adds what
    no single node says (the gang's need against its network domains). ``resolvable`` is
    False when no amount of waiting lets the gang fit (the fairness gate's input)."""

    total_nodes: int
    failures: tuple[MemberFailure, ...] = ()
    detail: str = ""
    resolvable: bool = True
    node_errors: tuple[tuple[str, str], ...] = ()
    """(node, error) for each node a plugin raised on during the decision."""

    @property
    def reasons(self) -> Counter:
        """Reason text → nodes, summed over the member kinds (prefixed by the kind when the
        gang has more than one)."""
        out: Counter = Counter()
        many = len(self.failures) > 1
        for f in self.failures:
            for text, n in f.histogram().items():
                out[f"{f.what}: {text}" if many else text] += n
        return out

    @property
    def summary(self) -> str:
        """kube-scheduler's form; one clause per member kind when the gang has several."""
        if len(self.failures) == 1:
            text = self.failures[0].line(self.total_nodes)
        elif self.failures:
            text = "; ".join(f"{f.what}: {f.line(self.total_nodes)}" for f in self.failures)
        else:
            text = f"0/{self.total_nodes} nodes are available"
        if self.detail:
            text += f"; {self.detail}"
        return text + "."


def statuses_of(failures: Mapping[str, Status]) -> dict[str, Status]:
    """A plain, sorted copy (whole-value comparisons in tests do not depend on visit order)."""
    return dict(sorted(failures.items()))
