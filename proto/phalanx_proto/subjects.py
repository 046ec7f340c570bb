"""The bus table: every stream, subject, durable consumer and KV bucket of Phalanx, and which
identity may publish, consume, read or write each one.

This is the one place an address is written (contract C3). Everything else derives from it:

* ``phalanx_bus`` declares ``STREAMS`` and ``BUCKETS`` and names span destinations from
  ``CHANNELS`` (``template_of``); the services' durable consumers take their filters from
  ``CONSUMERS``; the consumer loop refuses an event whose kind is not one of its channel's;
* ``phalanx_bus.permissions`` turns the grants below into each identity's NATS publish and
  subscribe permissions (rendered into the account JWT's scoped signing keys);
* ``phalanx asyncapi`` writes ``proto/asyncapi.yaml`` and ``phalanx bus permissions`` the
  permission table of docs/security.md.

Placeholders in templates: ``{gang}`` is ``gang_key(gang_id)`` (two tokens, ``<ns>.<name>``),
``{node}`` is ``token(node)`` (one token). For a per-node identity (``Identity.per_node``) a
``{node}`` in a grant means *its own node(s) only*: the server expands it from the node tags
of the identity's credential. Whoever adds a subject, bucket or consumer adds it here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import msgspec

from phalanx_proto import events as E

# -- identities ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    name: str
    description: str
    per_node: bool = False
    """A node agent: its credential names its node(s) (tags ``node:<token>``) and every
    ``{node}`` in its grants is limited to those."""
    includes: tuple[str, ...] = ()
    """Identities whose grants this one also has (``{node}`` as any node unless ``per_node``)."""


ADMIN = "admin"
GANG_COORDINATOR = "gang-coordinator"
PLACEMENT = "placement"
BINDER = "binder"
TOPOLOGY_DISCOVERY = "topology-discovery"
MIG_MANAGER = "mig-manager"
READER = "reader"
SUBSCRIBER = "subscriber"
SIMULATOR = "simulator"
NODE_FLEET = "node-fleet"

IDENTITIES = {i.name: i for i in (
    Identity(ADMIN, "Declares streams, buckets and their replicas (`phalanx bus init`, the bootstrap Job, "
                    "test fixtures); the only identity with the JetStream admin API."),
    Identity(GANG_COORDINATOR, "Runs the saga: the only publisher of placement, bind and MIG commands."),
    Identity(PLACEMENT, "Decides and reserves: the only writer of phx-ledger."),
    Identity(BINDER, "Binds placed pods; reads the ledger and topology."),
    Identity(TOPOLOGY_DISCOVERY, "Node agent: reports its own node's topology, heartbeat and Kubernetes state.",
             per_node=True),
    Identity(MIG_MANAGER, "Node agent: consumes its own node's MIG commands, owns its MIG records.", per_node=True),
    Identity(READER, "Read-only KV access for `phalanx explain` and `phalanx doctor`."),
    Identity(SUBSCRIBER, "Read-only: gang status and topology events (`phalanx events`, other teams)."),
    Identity(SIMULATOR, "Loads nodes and pods into the simulated cluster (`phalanx up`, simulator only)."),
    Identity(NODE_FLEET, "Simulator only: one process playing every simulated node's agents (any node).",
             includes=(TOPOLOGY_DISCOVERY, MIG_MANAGER)),
)}
SERVICE_IDENTITIES = (TOPOLOGY_DISCOVERY, GANG_COORDINATOR, PLACEMENT, MIG_MANAGER, BINDER)

# -- streams ------------------------------------------------------------------------------


KIB, MIB, GIB = 1024, 1024**2, 1024**3


@dataclass(frozen=True)
class Stream:
    """A stream and its limits. Every stream is bounded in bytes (``max_bytes``, old messages
    discarded first), in message size (``max_msg_size``: the server refuses a larger one) and,
    where one publisher owns a subject, per subject (``max_msgs_per_subject``): no identity can
    grow a stream past its share (docs/security.md, "Storage limits", has the arithmetic)."""

    name: str
    subjects: tuple[str, ...]
    max_bytes: int
    max_msg_size: int
    max_age_s: float = 7 * 24 * 3600
    max_msgs_per_subject: int = -1
    allow_schedules: bool = False


STREAM_GANG = "PHX_GANG"
STREAM_TOPOLOGY = "PHX_TOPOLOGY"
STREAM_NODE = "PHX_NODE"
STREAM_DEADLINE = "PHX_DEADLINE"
STREAM_DEAD_LETTER = "PHX_DLQ"
STREAM_DECISIONS = "PHX_DECISIONS"

NODE_MESSAGE_MAX = 8 * KIB
"""A MIG command or reply is a few hundred bytes."""
TOPOLOGY_REPORT_MAX = 256 * KIB
"""A 64-GPU, 64-NIC node's report (128 × 127 relations) is about 200 KiB; an 8-GPU one 5 KiB."""
NODE_STATE_MAX = 512 * KIB
"""A node's Kubernetes state at its bounds (1,024 labels, 4,096 host ports, 4,096 pods)."""
GANG_MESSAGE_MAX = 1 * MIB
"""nats-server's default max_payload."""

STREAMS = (
    Stream(STREAM_GANG, ("phx.gang.>",), max_bytes=1 * GIB, max_msg_size=GANG_MESSAGE_MAX),
    Stream(STREAM_TOPOLOGY, ("phx.topology.>",), max_bytes=512 * MIB, max_msg_size=TOPOLOGY_REPORT_MAX,
           max_msgs_per_subject=4),
    Stream(STREAM_NODE, ("phx.node.>",), max_bytes=256 * MIB, max_msg_size=NODE_MESSAGE_MAX,
           max_msgs_per_subject=1024),
    Stream(STREAM_DEADLINE, ("phx.deadline.>",), max_bytes=64 * MIB, max_msg_size=NODE_MESSAGE_MAX,
           allow_schedules=True),
    Stream(STREAM_DEAD_LETTER, ("phx.dlq.>",), max_bytes=512 * MIB, max_msg_size=GANG_MESSAGE_MAX + 64 * KIB,
           max_age_s=30 * 24 * 3600, max_msgs_per_subject=64),
    Stream(STREAM_DECISIONS, ("phx.decisions.>",), max_bytes=256 * MIB, max_msg_size=GANG_MESSAGE_MAX,
           max_age_s=24 * 3600),
)

# -- channels (subjects) ------------------------------------------------------------------


@dataclass(frozen=True)
class Channel:
    id: str
    template: str
    stream: str
    kinds: tuple[str, ...]
    """Event tags allowed on the channel; a consumer refuses any other (a forgery or a bug)."""
    publishers: tuple[str, ...]
    description: str
    subscribers: tuple[str, ...] = ()
    """Identities allowed a plain (non-durable) subscription, e.g. ``phalanx events``."""
    receiver: str = ""
    """Who consumes it, in words (AsyncAPI)."""
    carries: tuple[str, ...] = ()
    """For a channel of ``gang.batch`` messages: the event tags its batches may carry (any
    other is refused alone, the rest of its batch goes on)."""


def _tags(*types: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(E.tag_of(t) for t in types)


_EVERYONE_WATCHING = (SUBSCRIBER, READER)
CHANNELS = (
    Channel("gangPlacement", "phx.gang.placement.{gang}", STREAM_GANG,
            _tags(E.PlaceRequested, E.ReleaseRequested, E.AdoptRequested), (GANG_COORDINATOR,),
            "Commands to placement: place and reserve a whole gang (all or nothing), drop exactly the named "
            "reservations, or record one for a pod the reconciler found bound without it. Each is checked "
            "against the gang's record in KV phx-gangs and the ledger.", receiver="placement"),
    Channel("gangPlacementBatch", "phx.gang.placement.{replica}", STREAM_GANG, _tags(E.GangBatch),
            (GANG_COORDINATOR,), "The same commands to placement, in batches from one gang-coordinator replica: "
            "the placements and releases its handlers sent while its previous batch was being stored.",
            receiver="placement", carries=_tags(E.PlaceRequested, E.ReleaseRequested)),
    Channel("gangBinder", "phx.gang.binder.{gang}", STREAM_GANG, _tags(E.BindPods, E.UnreserveClaims),
            (GANG_COORDINATOR,), "Commands to binder: bind a gang's members to the reservations the ledger holds "
            "(one BindPods a gang); take a rolled-back attempt's unbound members out of their ResourceClaims.",
            receiver="binder"),
    Channel("gangBinderBatch", "phx.gang.binder.{replica}", STREAM_GANG, _tags(E.GangBatch), (GANG_COORDINATOR,),
            "The same commands to binder, in batches from one gang-coordinator replica.", receiver="binder",
            carries=_tags(E.BindPods)),
    Channel("gangEvict", "phx.gang.evict.{gang}", STREAM_GANG, _tags(E.EvictPods), (PLACEMENT,),
            "Commands to binder: evict, through the Eviction API, the pods of the victim gangs of the preemptor's "
            "nomination (docs/preemption.md). Checked against the nomination and the reservations in phx-ledger.",
            receiver="binder"),
    Channel("gangEvictionRefused", "phx.gang.placement.refused.{gang}", STREAM_GANG, _tags(E.EvictionRefused),
            (BINDER,), "Replies of binder to placement: a victim's eviction was refused (a PodDisruptionBudget); "
            "placement drops the preemptor's nomination.", receiver="placement"),
    Channel("gangPlacementAnswers", "phx.gang.coord.answers.{replica}", STREAM_GANG, _tags(E.GangBatch),
            (PLACEMENT,), "Replies of a placement replica to gang-coordinator, in batches: what a scheduling cycle "
            "decided (and the releases carried out meanwhile) as one message, each reply handled as if it came "
            "alone on its gang's subject. Replaces phx.gang.coord.placement.{gang} (one reply a message).",
            receiver="gang-coordinator", carries=_tags(E.Reserved, E.PlacementFailed, E.Preempting, E.Released)),
    Channel("gangBinderAnswers", "phx.gang.coord.bound.{replica}", STREAM_GANG, _tags(E.GangBatch),
            (BINDER,), "Replies of a binder replica to gang-coordinator, in batches (the gangs whose binds ended "
            "while its previous batch was being stored). Replaces phx.gang.coord.binder.{gang}.",
            receiver="gang-coordinator", carries=_tags(E.BindsDone)),
    Channel("gangStatus", "phx.gang.status.{gang}", STREAM_GANG,
            _tags(E.GangAdmitted, E.GangScheduled, E.GangPending, E.RollbackStarted), (GANG_COORDINATOR,),
            "What happens to a gang, for everybody else: an attempt starts, it is scheduled, it waits (with "
            "the reason its pods show), it is rolled back. Phalanx itself does not consume it.",
            subscribers=_EVERYONE_WATCHING, receiver="subscribers"),
    Channel("topology", "phx.topology.{node}", STREAM_TOPOLOGY, _tags(E.NodeTopologyReported),
            (TOPOLOGY_DISCOVERY,),
            "A node's GPU/NIC topology, published when it changes (new hardware generation, new labels). The "
            "current report is also in KV phx-topology; heartbeats go to KV phx-heartbeat only.",
            subscribers=_EVERYONE_WATCHING, receiver="subscribers"),
    Channel("nodeMig", "phx.node.{node}.mig", STREAM_NODE, _tags(E.MigPrepareRequested, E.MigDestroyRequested),
            (GANG_COORDINATOR,), "Commands to the mig-manager of one node: create or destroy a MIG instance.",
            receiver="mig-manager"),
    Channel("nodeReply", "phx.node.{node}.reply", STREAM_NODE, _tags(E.MigReady, E.MigFailed, E.MigDestroyed),
            (MIG_MANAGER,), "Replies of a node's mig-manager.", receiver="gang-coordinator"),
    Channel("deadlineSchedule", "phx.deadline.sched.{gang}", STREAM_DEADLINE, _tags(E.GangDeadline),
            (GANG_COORDINATOR,),
            "An attempt's deadline, stored as a JetStream scheduled message (header Nats-Schedule: @at <time>); "
            "one pending schedule per subject, so a new attempt's deadline replaces the old one.",
            receiver="the NATS server"),
    Channel("deadlineFired", "phx.deadline.fired.{gang}", STREAM_DEADLINE, _tags(E.GangDeadline), (),
            "The deadline, delivered by the server at its time (Nats-Schedule-Target). Ignored unless the "
            "attempt is still running.", receiver="gang-coordinator"),
    Channel("placementDecisions", "phx.decisions.{replica}", STREAM_DECISIONS, _tags(E.DecisionsRecorded),
            (PLACEMENT,), "Each placement replica's decision log: the cluster's changes as its cache saw them and "
            "every engine decision with its outcome, in order, so `phalanx sim --replay` can decide them again "
            "(docs/whatif.md, Replay). Bounded: the oldest records go first.", receiver="phalanx sim --replay"),
    Channel("deadLetter", "phx.dlq.{stream}.{consumer}", STREAM_DEAD_LETTER, (), (),
            "Messages a consumer gave up on (undecodable, refused with PermanentError, not allowed on their "
            "subject, or failed on their last delivery): the original payload with the error and origin in "
            "headers. Each consumer may publish only its own.",
            receiver="operators"),
)
CHANNEL = {c.id: c for c in CHANNELS}

# -- durable consumers --------------------------------------------------------------------


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer. ``creator`` declares it (the admin's ``phalanx bus init``, or
    gang-coordinator for a node's MIG commands, ``node_consumer``); ``identity`` only binds,
    pulls and acks. No other identity may create a consumer: the server does not check a
    consumer's deliver subject against its creator's rights, so a push consumer would let its
    creator publish stored messages anywhere (docs/security.md)."""

    durable: str
    stream: str
    filter: str
    identity: str
    channels: tuple[str, ...]
    """The channel ids the filter selects (checked by tests: all of them and nothing else)."""
    creator: str = ADMIN
    ack_wait_s: float = 10.0
    max_deliver: int = 50


CONSUMERS = (
    Consumer("placement", STREAM_GANG, "phx.gang.placement.>", PLACEMENT,
             ("gangPlacement", "gangPlacementBatch", "gangEvictionRefused")),
    Consumer("binder", STREAM_GANG, "phx.gang.binder.>", BINDER, ("gangBinder", "gangBinderBatch")),
    Consumer("binder-evict", STREAM_GANG, "phx.gang.evict.>", BINDER, ("gangEvict",)),
    Consumer("gang-coordinator", STREAM_GANG, "phx.gang.coord.>", GANG_COORDINATOR,
             ("gangPlacementAnswers", "gangBinderAnswers")),
    Consumer("gang-coordinator-node", STREAM_NODE, "phx.node.*.reply", GANG_COORDINATOR, ("nodeReply",)),
    Consumer("gang-coordinator-deadline", STREAM_DEADLINE, "phx.deadline.fired.>", GANG_COORDINATOR,
             ("deadlineFired",)),
    Consumer("mig-manager-{node}", STREAM_NODE, "phx.node.{node}.mig", MIG_MANAGER, ("nodeMig",),
             creator=GANG_COORDINATOR),
    Consumer("mig-manager-fleet", STREAM_NODE, "phx.node.*.mig", NODE_FLEET, ("nodeMig",)),
)
CONSUMER = {c.durable: c for c in CONSUMERS}

# -- KV buckets ---------------------------------------------------------------------------

INFO, READ, WATCH, WRITE = "info", "read", "watch", "write"
"""Bucket access levels, each including the ones before: open the bucket (stream info); get
keys; also watch (ephemeral consumers on the bucket); also put/create/update/delete keys."""


@dataclass(frozen=True)
class Grant:
    identity: str
    level: str
    keys: str = ">"
    """Key pattern: ``>`` (all), ``{node}`` (the node agent's own key), ``{node}.>``."""


@dataclass(frozen=True)
class Bucket:
    """A KV bucket: its history, limits (``max_value_size`` refused above, ``max_bytes`` in
    all) and who may do what with it. No bucket allows rollup headers (``Nats-Rollup``): a
    writer of one key could otherwise erase every other key of the bucket."""

    name: str
    history: int
    description: str
    grants: tuple[Grant, ...]
    max_value_size: int = 64 * KIB
    max_bytes: int = 64 * MIB
    atomic: bool = False
    rollups: bool = False
    """Allow rollup headers (KV purge): only for a bucket outside this table (tests)."""
    """Allow JetStream atomic batch publish on the bucket's stream."""
    simulator_only: bool = False
    value: str = ""
    """The AsyncAPI message id of its values (``kv.<Struct>``), when they have a schema."""
    key: str = ">"
    """The key's form, in template placeholders (AsyncAPI)."""


KV_TOPOLOGY = "phx-topology"
KV_HEARTBEAT = "phx-heartbeat"
KV_LEDGER = "phx-ledger"
KV_GANGS = "phx-gangs"
KV_LEASES = "phx-leases"
KV_MIG = "phx-mig"
KV_NODE_STATE = "phx-node-state"
KV_QUEUES = "phx-queues"
KV_DRA = "phx-dra"
KV_SIM_QUEUES = "phx-sim-queues"
KV_SIM_NAMESPACES = "phx-sim-namespaces"
KV_SIM_PODS = "phx-sim-pods"
KV_SIM_NODES = "phx-sim-nodes"
KV_SIM_EVENTS = "phx-sim-events"
KV_SIM_LEASES = "phx-sim-leases"
KV_SIM_DEVICE_CLASSES = "phx-sim-deviceclasses"
KV_SIM_RESOURCE_SLICES = "phx-sim-resourceslices"
KV_SIM_RESOURCE_CLAIMS = "phx-sim-resourceclaims"

BUCKETS = (
    Bucket(KV_TOPOLOGY, 1, "The current topology report of each node.",
           (Grant(TOPOLOGY_DISCOVERY, WRITE, "{node}"), Grant(PLACEMENT, WATCH), Grant(BINDER, WATCH),
            Grant(GANG_COORDINATOR, WATCH), Grant(READER, READ)), max_value_size=TOPOLOGY_REPORT_MAX, max_bytes=512 * MIB,
           value="kv.NodeTopologyReported", key="{node}"),
    Bucket(KV_HEARTBEAT, 1, "The last heartbeat of each node's topology-discovery.",
           (Grant(TOPOLOGY_DISCOVERY, WRITE, "{node}"), Grant(PLACEMENT, WATCH), Grant(READER, READ)),
           max_value_size=1 * KIB, max_bytes=16 * MIB, value="kv.NodeHeartbeat", key="{node}"),
    Bucket(KV_NODE_STATE, 1, "Each node's Kubernetes state for the non-GPU filters (allocatable, taints, labels, "
           "cordon, Ready, the requests and host ports of the pods Phalanx did not place there) and the pods "
           "Phalanx placed that run there.",
           (Grant(TOPOLOGY_DISCOVERY, WRITE, "{node}"), Grant(PLACEMENT, WATCH), Grant(GANG_COORDINATOR, WATCH),
            Grant(READER, READ)),
           max_value_size=NODE_STATE_MAX, max_bytes=512 * MIB, value="kv.NodeKubeState", key="{node}"),
    Bucket(KV_LEDGER, 8, "Every reservation on one node (key: the node), and what each queue holds (key: "
           "queue.<queue>); all nodes and queues of a decision commit in one atomic batch. Also each queue's "
           "recent usage for the fair share (key: history.<queue>, placement by compare-and-set).",
           (Grant(PLACEMENT, WRITE), Grant(PLACEMENT, WATCH), Grant(BINDER, WATCH), Grant(GANG_COORDINATOR, WATCH),
            Grant(MIG_MANAGER, READ, "{node}"), Grant(READER, READ)),
           max_value_size=GANG_MESSAGE_MAX, max_bytes=1 * GIB, atomic=True, value="kv.NodeLedger", key="{node}"),
    Bucket(KV_QUEUES, 1, "Each queue as its Queue object says (quota, limit, weight, parent, who may use it), "
           "in queue units, with the problem that makes it unusable if any. Written by gang-coordinator.",
           (Grant(GANG_COORDINATOR, WRITE), Grant(PLACEMENT, WATCH), Grant(READER, READ)),
           max_value_size=64 * KIB, max_bytes=64 * MIB, value="kv.QueueSpec", key="{queue}"),
    Bucket(KV_DRA, 1, "Each DRA pool (a driver's ResourceSlices for one pool, key: the pool's token) with the "
           "devices ResourceClaims hold in it, as gang-coordinator reads them from the API server (docs/dra.md).",
           (Grant(GANG_COORDINATOR, WRITE), Grant(PLACEMENT, WATCH), Grant(READER, READ)),
           max_value_size=GANG_MESSAGE_MAX, max_bytes=256 * MIB, value="kv.DraPool", key="{pool}"),
    Bucket(KV_GANGS, 8, "The saga state of each gang. Written by compare-and-set only.",
           (Grant(GANG_COORDINATOR, WRITE), Grant(GANG_COORDINATOR, WATCH), Grant(PLACEMENT, WATCH),
            Grant(READER, READ)), max_value_size=GANG_MESSAGE_MAX, max_bytes=1 * GIB, value="kv.GangState",
           key="{gang}"),
    Bucket(KV_LEASES, 1, "Leases that elect one active replica of a singleton loop (the reconciler).",
           (Grant(GANG_COORDINATOR, WRITE), Grant(READER, READ))),
    Bucket(KV_MIG, 1, "Who owns each MIG instance of a node, by slot (written before the create, verified after).",
           (Grant(MIG_MANAGER, WRITE, "{node}"), Grant(GANG_COORDINATOR, WATCH), Grant(BINDER, WATCH),
            Grant(READER, READ)),
           max_value_size=256 * KIB, max_bytes=256 * MIB, value="kv.NodeMig", key="{node}"),
    Bucket(KV_SIM_QUEUES, 2, "Simulated cluster: Queue objects (scheduling.phalanx.io/v1alpha1).",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, WRITE), Grant(READER, READ)),
           max_value_size=64 * KIB, max_bytes=64 * MIB, simulator_only=True),
    Bucket(KV_SIM_NAMESPACES, 2, "Simulated cluster: Namespace objects (their labels).",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, READ), Grant(GANG_COORDINATOR, WATCH), Grant(READER, READ)),
           max_value_size=64 * KIB, max_bytes=64 * MIB, simulator_only=True),
    Bucket(KV_SIM_PODS, 4, "Simulated cluster: pods.",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, WRITE), Grant(GANG_COORDINATOR, WATCH),
            Grant(BINDER, WRITE), Grant(BINDER, WATCH), Grant(READER, READ), Grant(TOPOLOGY_DISCOVERY, READ)),
           max_value_size=1 * MIB, max_bytes=1 * GIB, simulator_only=True),
    Bucket(KV_SIM_NODES, 4, "Simulated cluster: nodes.",
           (Grant(SIMULATOR, WRITE), Grant(TOPOLOGY_DISCOVERY, WRITE, "{node}"), Grant(GANG_COORDINATOR, READ),
            Grant(BINDER, READ), Grant(READER, READ)), max_value_size=NODE_STATE_MAX, max_bytes=256 * MIB,
           simulator_only=True),
    Bucket(KV_SIM_LEASES, 2, "Simulated cluster: coordination Leases (the device plugin's fences).",
           (Grant(SIMULATOR, WRITE), Grant(BINDER, WRITE), Grant(TOPOLOGY_DISCOVERY, READ), Grant(READER, READ),
            Grant(GANG_COORDINATOR, INFO)), max_value_size=256 * KIB, max_bytes=64 * MIB, simulator_only=True),
    Bucket(KV_SIM_EVENTS, 2, "Simulated cluster: events of each pod.",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, WRITE), Grant(BINDER, WRITE), Grant(READER, READ),
            Grant(TOPOLOGY_DISCOVERY, INFO)), max_value_size=256 * KIB, max_bytes=256 * MIB, simulator_only=True),
    Bucket(KV_SIM_DEVICE_CLASSES, 2, "Simulated cluster: DeviceClasses (resource.k8s.io/v1), read by gang-coordinator.",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, READ), Grant(GANG_COORDINATOR, WATCH), Grant(READER, READ)),
           max_value_size=256 * KIB, max_bytes=64 * MIB, simulator_only=True),
    Bucket(KV_SIM_RESOURCE_SLICES, 2, "Simulated cluster: ResourceSlices (resource.k8s.io/v1), the devices DRA drivers "
           "publish; read by gang-coordinator.",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, READ), Grant(GANG_COORDINATOR, WATCH), Grant(READER, READ)),
           max_value_size=1 * MIB, max_bytes=256 * MIB, simulator_only=True),
    Bucket(KV_SIM_RESOURCE_CLAIMS, 2, "Simulated cluster: ResourceClaims (resource.k8s.io/v1); gang-coordinator reads "
           "them, binder writes their finalizer, allocation and reservedFor and creates extended-resource claims.",
           (Grant(SIMULATOR, WRITE), Grant(GANG_COORDINATOR, READ), Grant(GANG_COORDINATOR, WATCH),
            Grant(BINDER, WRITE), Grant(READER, READ)),
           max_value_size=1 * MIB, max_bytes=256 * MIB, simulator_only=True),
)
BUCKET = {b.name: b for b in BUCKETS}


def declared_bytes(*, simulator: bool = True) -> int:
    """Bytes every stream and bucket of the table may hold at most (each copy of a replicated
    one): what the account's JetStream storage limit is sized from."""
    return (sum(s.max_bytes for s in STREAMS)
            + sum(b.max_bytes for b in BUCKETS if simulator or not b.simulator_only))


ACCOUNT_MAX_STREAMS = 64
"""Streams the PHALANX account may have (the table declares 6 and 18 buckets). With every
stream required to declare its size (the account JWT's ``max_bytes_required``), the account's
storage is at most the sum the table declares (``declared_bytes``), times the replicas. The
account JWT carries no total in bytes: nats-server counts a stream's replicas against it and
refuses to serve the account on a server whose disk is smaller than it, so one number cannot
fit both a single server and a 3-server cluster (docs/security.md, "Storage limits")."""
NODE_AGENT_PAYLOAD_MAX = NODE_STATE_MAX + 16 * KIB
"""The largest message a node agent's connection may publish (user JWT ``payload``): its
largest record plus headers."""

EXTRA_API: dict[str, tuple[str, ...]] = {
    READER: (f"STREAM.INFO.{STREAM_DECISIONS}", f"STREAM.MSG.GET.{STREAM_DECISIONS}"),
}
"""JetStream API calls outside the rules above, per identity (``$JS.API.`` + entry): the
reader reads placement's decision log message by message (``phalanx sim --replay``)."""

# -- addresses ----------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(value: str) -> str:
    """A string made safe as one subject token or KV key token (lossy; routing only)."""
    return _UNSAFE.sub("_", value) or "_"


_ESCAPED = re.compile(r"[^A-Za-z0-9-]+")


def _escape(value: str) -> str:
    """``value`` as one token, reversibly: every byte outside ``[A-Za-z0-9-]`` becomes ``_``
    and two hex digits (``.`` is ``_2e``, ``_`` is ``_5f``, ``:`` is ``_3a``); ``""`` is ``_``."""
    return _ESCAPED.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode()), value) or "_"


def gang_key(gang_id: str) -> str:
    """KV key (and subject tokens) of a gang: ``<namespace>.<name>``, each part escaped so that
    two gang ids never share a key (``ns/a.b`` is ``ns.a_2eb``, ``ns/a_b`` is ``ns.a_5fb``,
    ``ns/JobSet:train`` is ``ns.JobSet_3atrain``)."""
    ns, _, name = gang_id.partition("/")
    return f"{_escape(ns)}.{_escape(name)}"


def gang_key_of_subject(subject: str) -> str:
    """The ``gang_key`` a subject of a ``…{gang}`` channel names (its last two tokens): one
    gang's messages share it whichever of its channels they travel on."""
    return ".".join(subject.split(".")[-2:])


def render(template: str, *, gang: str | None = None, node: str | None = None, **tokens: str) -> str:
    """A template with its placeholders filled: ``gang`` is a gang id, ``node`` a node name,
    other placeholders take a value made into one token."""
    out = template
    if gang is not None:
        out = out.replace("{gang}", gang_key(gang))
    if node is not None:
        out = out.replace("{node}", token(node))
    for k, v in tokens.items():
        out = out.replace("{" + k + "}", token(v))
    if "{" in out:
        raise ValueError(f"{template}: placeholder left unfilled in {out}")
    return out


_PATTERN = {"{gang}": r"[^.]+\.[^.]+", "{node}": r"[^.]+", "{replica}": r"[^.]+", "{stream}": r"[^.]+",
            "{consumer}": r"[^.]+"}


def _regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{\w+\})", template)
    return re.compile("^" + "".join(_PATTERN.get(p, re.escape(p)) for p in parts) + "$")


_MATCHERS = tuple((_regex(c.template), c) for c in CHANNELS)


def channel_of(subject: str) -> Channel | None:
    """The channel a concrete subject belongs to, or ``None``."""
    for pattern, channel in _MATCHERS:
        if pattern.match(subject):
            return channel
    return None


def placement_subject(gang_id: str) -> str:
    return render(CHANNEL["gangPlacement"].template, gang=gang_id)


def binder_subject(gang_id: str) -> str:
    return render(CHANNEL["gangBinder"].template, gang=gang_id)


def evict_subject(gang_id: str) -> str:
    """Where placement tells binder to evict the victims of ``gang_id``'s nomination."""
    return render(CHANNEL["gangEvict"].template, gang=gang_id)


def eviction_refused_subject(gang_id: str) -> str:
    """Where binder tells placement that evicting a victim of ``gang_id``'s nomination was refused."""
    return render(CHANNEL["gangEvictionRefused"].template, gang=gang_id)


def placement_answers_subject(replica: str) -> str:
    """Where placement replica ``replica`` answers gang-coordinator: ``GangBatch``es of
    Reserved, PlacementFailed and Released."""
    return render(CHANNEL["gangPlacementAnswers"].template, replica=replica)


def binder_answers_subject(replica: str) -> str:
    """Where binder replica ``replica`` answers gang-coordinator: ``GangBatch``es of BindsDone."""
    return render(CHANNEL["gangBinderAnswers"].template, replica=replica)


def placement_batch_subject(replica: str) -> str:
    """Where gang-coordinator replica ``replica`` sends placement its batched commands."""
    return render(CHANNEL["gangPlacementBatch"].template, replica=replica)


def binder_batch_subject(replica: str) -> str:
    """Where gang-coordinator replica ``replica`` sends binder its batched ``bind.pods``."""
    return render(CHANNEL["gangBinderBatch"].template, replica=replica)


def status_subject(gang_id: str) -> str:
    return render(CHANNEL["gangStatus"].template, gang=gang_id)


def topology_subject(node: str) -> str:
    return render(CHANNEL["topology"].template, node=node)


def mig_subject(node: str) -> str:
    return render(CHANNEL["nodeMig"].template, node=node)


MIG_EVERY_NODE = CONSUMER["mig-manager-fleet"].filter
"""Every node's MIG commands: the filter of a node fleet's single consumer (simulator only;
a real node's mig-manager filters on its own ``mig_subject``)."""


def node_of_mig_subject(subject: str) -> str:
    """The node token of a ``phx.node.<node>.mig`` subject ("" for any other subject)."""
    parts = subject.split(".")
    return parts[2] if len(parts) == 4 and parts[:2] == ["phx", "node"] and parts[3] == "mig" else ""


def node_reply_subject(node: str) -> str:
    return render(CHANNEL["nodeReply"].template, node=node)


def deadline_schedule_subject(gang_id: str) -> str:
    """Where a gang's deadline is scheduled; one pending schedule per subject, so a new
    attempt's deadline replaces the previous one."""
    return render(CHANNEL["deadlineSchedule"].template, gang=gang_id)


def deadline_fired_subject(gang_id: str) -> str:
    """Where the server delivers the deadline; must be inside ``PHX_DEADLINE`` (the server
    refuses a schedule target outside the stream)."""
    return render(CHANNEL["deadlineFired"].template, gang=gang_id)


def dead_letter_subject(stream: str, consumer: str) -> str:
    return render(CHANNEL["deadLetter"].template, stream=stream, consumer=consumer)


def durable(name: str, node: str | None = None) -> Consumer:
    """The consumer declaration of durable ``name`` (a per-node template such as
    ``mig-manager-{node}`` filled for ``node``)."""
    c = CONSUMER[name]
    if node is None:
        return c
    return replace(c, durable=render(c.durable, node=node), filter=render(c.filter, node=node))


def node_consumer(node: str) -> Consumer:
    """The durable through which ``node``'s mig-manager receives its MIG commands (created by
    gang-coordinator before it sends the node its first command)."""
    return durable("mig-manager-{node}", node)

