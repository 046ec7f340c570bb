"""Phalanx's contract on Kubernetes objects: every label and annotation key that users, their
workload controllers, node admins and node tools, or Phalanx itself write and Phalanx reads;
what a pod says to opt in and to ask for GPUs; and what binder writes for the node (the
assignment annotation on the pod, the fence Lease).

The other side of each is outside Phalanx's processes' memory, so it is wire contract like an
event: pods in users' YAML, labels a cluster's tools put on nodes, the kubelet's device plugin
reading the annotation and the fence, other tools reading the annotation. Every reader and writer
imports its keys from here (the object readers, the topology tiers, the engine, binder,
gang-coordinator, the device plugin, the Kubernetes port, ``phalanx sim``): one block, as a
Kubernetes controller keeps its constants.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Final

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

# --- what users write on pods (and pod templates) and namespaces --------------------------------
QUEUE_LABEL = "scheduling.phalanx.io/queue"
"""Pod (or pod template) label, else namespace label, naming the pod's queue (docs/queues.md)."""
REPLICA_LABEL = "replica"
"""R4: ``replica: "N"`` asks for N GPUs, each with the same share (seed 004)."""
MIN_MEMBER_LABEL = "aliyun.com/min-member"
"""R8: the number of pods in the gang (= the JobSet's parallelism)."""
GANG_MIN_MEMBER = "phalanx.io/gang-min-member"
"""Label or annotation: the gang's size, said explicitly (wins over every other key)."""
GANG_MAX_MEMBER = "phalanx.io/gang-max-member"
"""Label or annotation: an elastic gang's largest size. The gang starts once its min-member
pods are placed together and grows, one whole member at a time, up to this (docs/workloads.md,
"Elastic gangs")."""
MIN_MEMBER_KEYS = (MIN_MEMBER_LABEL, "scheduling.x-k8s.io/min-member", "pod-group.scheduling.sigs.k8s.io/min-available")
"""Labels or annotations that say a gang's size, the first present counting: Phalanx's (the
seed's), then the coscheduling plugin's two generations."""
GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/name",
                "pod-group.scheduling.sigs.k8s.io")
"""Labels naming the pod's PodGroup (the coscheduling plugin's generations)."""
POD_GROUP_GROUP = "scheduling.k8s.io"
"""The upstream Workload API's group: a pod's ``spec.schedulingGroup.podGroupName`` names a
``PodGroup`` of its namespace whose ``spec.schedulingPolicy`` says the gang (docs/workloads.md,
"The upstream Workload API")."""
POD_GROUP_VERSIONS = ("v1beta1", "v1alpha2")
"""The versions of ``PodGroup`` Phalanx reads, the first the API server serves: beta in
Kubernetes 1.37, alpha in 1.36 (gate ``GenericWorkload``, ``--runtime-config``)."""
POD_GROUP_PLURAL = "podgroups"
POD_GROUP_SCHEDULED = "PodGroupScheduled"
"""The ``PodGroup`` status condition a scheduler reports (reason ``Unschedulable`` when False)."""
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""Annotation naming the pod's PodGroup (Volcano, arena)."""
TIMEOUT_ANNOTATION = "phalanx.io/gang-timeout-seconds"
"""The gang's attempt deadline (R9: 180 s when absent)."""
VENDOR_ANNOTATION = "phalanx.io/gpu-vendor"
"""``nvidia``, ``amd`` or ``ppu``: the GPU vendor an ``aliyun.com/gpu`` request must run on (R5)."""
ISOLATION_ANNOTATION = "phalanx.io/isolation"
"""How a TDM share is enforced on the node: ``hard``, ``mps`` or ``advisory`` (docs/delivery.md)."""

# --- what workload controllers write on their pods ------------------------------------------------
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOBSET_JOBS = "jobset.sigs.k8s.io/global-replicas"
JOBSET_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
"""JobSet annotation (copied onto its pods): one Job per domain of this node label. JobSet's pod
webhook then creates a Job's followers only once its leader (completion index 0) is scheduled."""
JOBSET_NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
"""JobSet annotation: exclusive placement by pre-labelled nodes instead (no leader-first order)."""
MPIJOB_NAME = "training.kubeflow.org/job-name"
MPIJOB_ROLE = "training.kubeflow.org/job-role"
JOB_NAME = "batch.kubernetes.io/job-name"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
"""LeaderWorkerSet: the LWS a pod belongs to (leader and workers alike)."""
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
"""LeaderWorkerSet: which replica (group) of the LWS the pod is in."""
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
"""LeaderWorkerSet: 0 for the leader, 1… for the workers."""
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
"""LeaderWorkerSet annotation: the group's pods, leader included."""
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
"""LeaderWorkerSet annotation (copied onto its pods): one group per domain of this node label.
The controller then creates a group's workers only once its leader is scheduled."""

# --- what node admins and node tools write on nodes -----------------------------------------------
ENABLE_LABEL = "lj_runtimekit_enable"
"""R11: ``true`` lets Phalanx use the node."""
ACK_LABEL = "ack.node.gpu.schedule"
"""R10: ``topology`` enables the node for topology-aware scheduling, ``default`` hands it back."""
HYPERNODE_LABEL = "phalanx.io/hypernode"
LEAF_LABEL = "phalanx.io/leaf-switch"
NETPOD_LABEL = "phalanx.io/network-pod"
"""Phalanx's own label key of each network tier, the first of ``TIER_LABEL_KEYS``."""
TIER_LABEL_KEYS = {
    "hypernode": (HYPERNODE_LABEL,
                  "accelerator.topograph.run/domain",         # topograph v1
                  "network.topology.nvidia.com/accelerator",  # topograph before v1
                  "nvidia.com/gpu.clique"),                   # GPU Operator, MNNVL systems
    "leaf": (LEAF_LABEL,
             "alibabacloud.com/asw-id",                       # ACK Lingjun: access switch
             "fabric.topograph.run/tier-0",                   # topograph v1: switch closest to the node
             "network.topology.nvidia.com/leaf",              # topograph 0.2+
             "network.topology.nvidia.com/block"),            # topograph 0.1
    "netpod": (NETPOD_LABEL,
               "alibabacloud.com/point-of-delivery",          # ACK Lingjun: PoD above the ASWs
               "fabric.topograph.run/tier-1",                 # topograph v1: next switch tier up
               "network.topology.nvidia.com/spine"),          # topograph, every version before v1
}
"""The node labels that name a node's domain at each network tier, most authoritative first
(``phalanx_topology.tiers``; a cluster's own keys replace them by configuration)."""
GPU_MODEL_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator", "aliyun.accelerator/nvidia_name")
"""Node labels that name the GPU model (GPU Feature Discovery, GKE, ACK), in the order tried."""

# --- what Kubernetes itself writes ------------------------------------------------------------------
HOSTNAME_LABEL = "kubernetes.io/hostname"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# --- the simulated cluster and phalanx sim's workloads (never a real cluster's) ----------------------
DISRUPTION_BUDGET_ANNOTATION = "sim.phalanx.io/disruptions-allowed"
"""Simulated cluster only: ``"0"`` on a pod stands for a PodDisruptionBudget that allows no
disruption of it now (``evict_pod`` refuses it)."""
SIM_UNHEALTHY_GPUS = "sim.phalanx.io/unhealthy-gpus"
"""Simulated cluster only: on a Node whose topology comes from a file (the simulator, kwok),
the indexes of its GPUs that have failed, comma-separated (``"2"``, ``"0,3"``): what NVML tells
topology-discovery on a real node (``NodeTopologyReported.unhealthy``, docs/repair.md)."""
SIM_ARRIVAL = "sim.phalanx.io/arrival"
SIM_DURATION = "sim.phalanx.io/duration"
SIM_REPEAT = "sim.phalanx.io/repeat"
SIM_EVERY = "sim.phalanx.io/every"
"""``phalanx sim`` workload annotations: when a pod arrives, how long it runs, how often again."""

# --- the preemption policy a pod (or a Queue) says -----------------------------------------------------
PREEMPT_LOWER_PRIORITY: Final = "PreemptLowerPriority"
"""``spec.preemptionPolicy`` (Kubernetes' default): the pod's gang may evict gangs of lower
priority (docs/preemption.md)."""
NEVER: Final = "Never"
"""``spec.preemptionPolicy``: the pod's gang waits and never preempts. Also the Queue's
``spec.preemption.withinQueue``/``reclaim`` value that turns a rule off."""
PREEMPTION_POLICIES = (PREEMPT_LOWER_PRIORITY, NEVER)

# --- the repair policy a gang's pods say ------------------------------------------------------------
REPAIR_POLICY_KEY: Final = "phalanx.io/repair-policy"
"""Label or annotation on a gang's pods: what a running gang that lost members does when its
domain has no room (``wait-then-restart``, ``wait``, ``widen``, ``restart``; docs/repair.md).
The Queue's ``spec.repairPolicy`` is the default."""

# --- what Phalanx writes ------------------------------------------------------------------------------
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
