"""Every metric Phalanx exports, declared here at import in the process-wide ``REGISTRY``
(``phalanx_telemetry.prom``: Counter, Gauge, Histogram, the text exposition), so the set of
names is known statically (``tests/unit/test_dashboards.py`` checks each dashboard query
against it) and the services only call ``inc``/``set``/``observe``.
``phalanx_service.shell.Health`` serves ``REGISTRY.render()`` on ``/metrics``. A declarative
table: one block per part of Phalanx, each metric with its help and its bounded labels.
"""

from __future__ import annotations

from phalanx_proto.vocab import PHASES, RefusalRule

# CONTENT_TYPE and REGISTRY are re-exported: whoever reads the registry from here has every metric
# below declared in it.
from phalanx_telemetry.prom import CONTENT_TYPE as CONTENT_TYPE
from phalanx_telemetry.prom import LATENCY_BUCKETS, Counter, Gauge, Histogram
from phalanx_telemetry.prom import REGISTRY as REGISTRY

# --- bus (phalanx_bus.consumer) -------------------------------------------------------------
OUTCOMES = ("ack", "nak", "term")
BUS_HANDLER_SECONDS = Histogram(
    "phalanx_bus_handler_duration_seconds", "Time a consumer's handler took per message, by consumer and event kind.",
    ["consumer", "kind"])
BUS_MESSAGES = Counter(
    "phalanx_bus_messages_total",
    "Messages handled, by consumer, event kind and outcome (ack, nak = retry later, term = never).",
    ["consumer", "kind", "outcome"], allowed={"outcome": OUTCOMES})
BUS_EVENTS = Counter(
    "phalanx_bus_events_total",
    "Events handled, by consumer, event kind and outcome: each event a batch carries counts alone (a batch is one "
    "message in phalanx_bus_messages_total, kind gang.batch).",
    ["consumer", "kind", "outcome"], allowed={"outcome": OUTCOMES})
SENT_KINDS = ("event", "kv_write", "kv_read", "ack", "fetch", "api", "other")
BUS_SENT = Counter(
    "phalanx_bus_sent_total",
    "Messages this process sent to NATS, each a write or a round trip (phalanx_bus.counting): by kind (event = a "
    "Phalanx event or command; kv_write, kv_read; ack; fetch = a pull consumer asking for more; api = other "
    "JetStream API calls) and target (the stream, bucket or API verb).",
    ["kind", "target"], allowed={"kind": SENT_KINDS}, max_series=200)
BUS_REDELIVERIES = Counter(
    "phalanx_bus_redeliveries_total", "Messages delivered more than once (num_delivered > 1).", ["consumer", "kind"])
DEAD_LETTER_CAUSES = ("undecodable", "misaddressed", "permanent", "exhausted")
BUS_DEAD_LETTERS = Counter(
    "phalanx_bus_dead_letters_total",
    "Messages a consumer gave up on and recorded on the dead-letter stream PHX_DLQ, by consumer and cause "
    "(undecodable; permanent = the handler refused it; exhausted = it failed on its last delivery). Alerted on.",
    ["consumer", "cause"], allowed={"cause": DEAD_LETTER_CAUSES})
BUS_DEAD_LETTERS_DROPPED = Counter(
    "phalanx_bus_dead_letters_dropped_total",
    "Dead letters counted but not stored: the consumer's copies to PHX_DLQ are rate-limited (a flood of junk "
    "on its subjects stores at most its burst and rate), by consumer and cause.",
    ["consumer", "cause"], allowed={"cause": DEAD_LETTER_CAUSES})
BUS_CONSUMER_PENDING = Gauge(
    "phalanx_bus_consumer_pending_messages",
    "JetStream consumer lag: messages in the stream not yet delivered to the consumer (num_pending).",
    ["stream", "consumer"])
BUS_CONSUMER_ACK_PENDING = Gauge(
    "phalanx_bus_consumer_ack_pending_messages", "Messages delivered to the consumer and not yet acknowledged.",
    ["stream", "consumer"])

# --- bad KV values (phalanx_bus.records) ------------------------------------------------------
KV_BUCKET_NAMES = ("phx-ledger", "phx-gangs", "phx-topology", "phx-heartbeat", "phx-node-state", "phx-mig", "phx-leases")
KV_INVALID_ENTRIES = Gauge(
    "phalanx_kv_invalid_entries",
    "Values in a KV bucket that do not decode or break the bucket's rule, found by this process's last full "
    "read of the bucket; they are skipped (0 is healthy; `phalanx doctor` names them).",
    ["bucket"], allowed={"bucket": KV_BUCKET_NAMES})

# --- checks against the record (placement, binder, gang-coordinator) --------------------------
REFUSAL_RULES = tuple(RefusalRule)
REFUSED = Counter(
    "phalanx_refused_messages_total",
    "Commands and replies refused because they do not match the record (ledger, gang record, cluster), by "
    "the rule they broke (docs/saga.md, Checks). Stale replies after a race count here too.",
    ["rule"], allowed={"rule": REFUSAL_RULES})

# --- placement ------------------------------------------------------------------------------
PLACEMENT_DECISION_SECONDS = Histogram(
    "phalanx_placement_decision_duration_seconds",
    "Time the engine took to decide one placement request (snapshot excluded), by outcome.",
    ["outcome"], allowed={"outcome": ("placed", "no_fit")})
QUEUE_ALLOCATED = Gauge("phalanx_queue_allocated_gpus",
                        "GPUs (whole-GPU equivalents) a queue's gangs hold, its subtree's included, by queue.",
                        ["queue"], max_series=1024)
QUEUE_QUOTA = Gauge("phalanx_queue_quota_gpus", "A queue's quota (deserved share), by queue.", ["queue"],
                    max_series=1024)
QUEUE_BORROWED = Gauge("phalanx_queue_borrowed_gpus", "GPUs a queue holds beyond its quota, by queue.", ["queue"],
                       max_series=1024)
QUEUE_PENDING_GPUS = Gauge("phalanx_queue_pending_gpus", "GPUs a queue's waiting gangs ask for, by queue.", ["queue"],
                           max_series=1024)
QUEUE_FAIR_SHARE = Gauge("phalanx_queue_fair_share_gpus",
                         "A queue's fair share of the cluster's GPUs (docs/queues.md), by queue.", ["queue"],
                         max_series=1024)
QUEUE_ADMISSIONS_REFUSED = Counter(
    "phalanx_queue_admissions_refused_total",
    "Pods gang-coordinator did not admit for their queue, by reason: missing (no such queue), invalid (the queue "
    "has a problem), namespace (its namespaceSelector does not select the pod's namespace), mixed (a gang's "
    "members name different queues).", ["reason"], allowed={"reason": ("missing", "invalid", "namespace", "mixed")})
QUEUE_REFUSALS = Counter(
    "phalanx_queue_refusals_total",
    "Placement requests refused for their queue (at its limit, or a queue that does not exist or is invalid), "
    "by queue.", ["queue"], max_series=1024)
QUEUE_USAGE_REPAIRS = Counter(
    "phalanx_queue_usage_repairs_total",
    "Queue usage records placement rewrote because they differed from what the ledger says (seen twice running), "
    "by queue; 0 is healthy.", ["queue"], max_series=1024)
PREEMPTION_RULES = ("priority", "reclaim")
PREEMPTIONS = Counter(
    "phalanx_preemptions_total",
    "Preemptions placement started (a nomination committed and the eviction sent), by rule: reclaim when a "
    "victim is taken back across queues, else priority (docs/preemption.md).", ["rule"],
    allowed={"rule": PREEMPTION_RULES})
PREEMPTED_GANGS = Counter(
    "phalanx_preempted_gangs_total", "Victim gangs named by the preemptions placement started, by rule.", ["rule"],
    allowed={"rule": PREEMPTION_RULES})
PREEMPTED_GPUS = Counter(
    "phalanx_preempted_gpus_total",
    "GPUs (whole-GPU equivalents) the victims of the preemptions placement started held, by rule.", ["rule"],
    allowed={"rule": PREEMPTION_RULES})
PREEMPTIONS_REFUSED = Counter(
    "phalanx_preemptions_refused_total",
    "Nominations placement dropped because binder could not evict a victim (a PodDisruptionBudget).")
PROMOTIONS = Counter(
    "phalanx_preemptions_promoted_total",
    "Nominations placement turned into the preemptor's reservation, in the batch that freed its victims' last "
    "GPUs or in its nomination pass (docs/preemption.md).")
NOMINATIONS_GIVEN_UP = Counter(
    "phalanx_nominations_given_up_total",
    "Preempting attempts placement answered with a failure because their nomination ended (expired, or the "
    "GPUs it keeps could not become the reservation), so the gang backs off and plans again.")
EVICTIONS = Counter(
    "phalanx_evictions_total",
    "Victim pods binder asked the Eviction API to evict, by result: evicted, refused (a PodDisruptionBudget: "
    "nothing of that preemption is evicted), gone (the pod was already deleted).", ["result"],
    allowed={"result": ("evicted", "refused", "gone")})
ENGINE_NODE_ERRORS = Counter(
    "phalanx_engine_node_errors_total",
    "Nodes a placement plugin raised on while deciding (each refused for that decision alone, with the "
    "status 'node could not be evaluated'); 0 is healthy.")
LEDGER_COMMIT_CONFLICTS = Counter(
    "phalanx_ledger_commit_conflicts_total",
    "Ledger commits that lost a compare-and-set race (another writer changed a node) and were decided again.")
ALLOC_MODES = ("whole", "shared", "mig")
GPUS_ALLOCATED = Gauge(
    "phalanx_gpus_allocated", "GPUs holding at least one reservation, by node, GPU model and mode.",
    ["node", "model", "mode"], allowed={"mode": ALLOC_MODES})
GPU_CORE_ALLOCATED = Gauge(
    "phalanx_gpu_core_allocated_percent",
    "Compute reserved, in percent of one GPU (100 per whole GPU), by node, model and mode.",
    ["node", "model", "mode"], allowed={"mode": ALLOC_MODES})
GPU_MEMORY_ALLOCATED = Gauge(
    "phalanx_gpu_memory_allocated_bytes",
    "GPU memory reserved (whole GPUs count their full memory), by node, model and mode.",
    ["node", "model", "mode"], allowed={"mode": ALLOC_MODES})
GPUS_CAPACITY = Gauge(
    "phalanx_gpus_capacity", "GPUs reported by topology-discovery on enabled nodes, by node and model.",
    ["node", "model"])
PLACEMENT_NODES = Gauge(
    "phalanx_placement_nodes",
    "Nodes in placement's cache, by state: fresh (topology reported, heartbeat within the staleness "
    "bound), stale (no heartbeat, or a late one: not placed on) or invalid (a record its agent wrote breaks "
    "its bucket's rule: not placed on; `phalanx doctor` names the rule).",
    ["state"], allowed={"state": ("fresh", "stale", "invalid")})
FRAGMENTATION = Gauge(
    "phalanx_cluster_fragmentation_ratio",
    "Share of free GPUs that sit on partially used nodes (cannot serve a whole-node request); "
    "0 = all free GPUs on empty nodes, 1 = every free GPU is stranded. See docs/observability.md.",
    ["model"])

# --- binder ---------------------------------------------------------------------------------
POD_PENDING_TO_BOUND_SECONDS = Histogram(
    "phalanx_pod_pending_to_bound_seconds", "Time from a pod's creation to its binding by Phalanx.",
    buckets=LATENCY_BUCKETS)
BINDS = Counter(
    "phalanx_binds_total", "Bind commands handled by binder, by result (bound, already_bound, failed).",
    ["result"], allowed={"result": ("bound", "already_bound", "failed")})
CLAIM_WRITES = Counter(
    "phalanx_claim_writes_total", "ResourceClaim writes before a Binding (reserved, failed) and by a rollback "
    "(unreserved), docs/dra.md.",
    ["result"], allowed={"result": ("reserved", "failed", "unreserved")})
FENCE_WRITES = Counter(
    "phalanx_fence_writes_total",
    "binder's writes of the per-node fences (docs/delivery.md), by result: written (one compare-and-set write, "
    "any number of pods added and released), unchanged (a release of pods the fence no longer lists: nothing "
    "written), failed.", ["result"], allowed={"result": ("written", "unchanged", "failed")})
FENCE_BATCH_PODS = Histogram(
    "phalanx_fence_batch_pods", "Pods added to a node's fence by one write of binder (a gang's pods on one node "
    "share a write).", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))

# --- gang-coordinator (called by its owner) ---------------------------------------------------
ROLLBACK_REASONS = ("placement_failed", "bind_failed", "mig_failed", "deadline", "member_deleted", "other")
GANG_ATTEMPTS = Counter("phalanx_gang_attempts_total", "Gang placement attempts started by gang-coordinator.")
GANG_ROLLBACKS = Counter(
    "phalanx_gang_rollbacks_total", "Gang attempts given up and compensated, by reason "
    f"({', '.join(ROLLBACK_REASONS)}).", ["reason"], allowed={"reason": ROLLBACK_REASONS})
REPAIR_OUTCOMES = ("in_domain", "widened", "anywhere", "restarted")
REPAIR_SIGNALS = ("node_not_ready", "node_deleted", "node_tainted", "node_cordoned", "gpu_unhealthy", "pod_deleted",
                  "pod_failed")
GANG_REPAIRS = Counter(
    "phalanx_gang_repairs_total", "Repairs of running gangs that lost members (docs/repair.md), by outcome: "
    "in_domain (replacements bound in the tightest domain the gang held), widened (one tier wider, by policy), "
    "anywhere (the gang held no common domain), restarted (the domain was given up: the whole gang restarted).",
    ["outcome"], allowed={"outcome": REPAIR_OUTCOMES})
GANG_REPAIR_SECONDS = Histogram(
    "phalanx_gang_repair_seconds", "Time from a running gang's first failed member being seen to every "
    "replacement bound (repairs that ended in their domain or widened).", buckets=LATENCY_BUCKETS)
GANG_MEMBER_FAILURES = Counter(
    "phalanx_gang_member_failures_total", "Bound members of running gangs seen failed, by signal.",
    ["signal"], allowed={"signal": REPAIR_SIGNALS})
GANGS = Gauge("phalanx_gangs", "Gangs known to gang-coordinator, by saga phase.", ["phase"],
              allowed={"phase": PHASES})
NOTICES_WAITING = Gauge(
    "phalanx_notices_waiting_pods",
    "Pods with a Warning event or PodScheduled condition handed to gang-coordinator's notifier and not yet sent "
    "(sent off the saga's path, at most one pod's calls in flight each; docs/observability.md).")
NOTICES_DROPPED = Counter(
    "phalanx_notices_dropped_total",
    "Pod events the notifier dropped unsent because newer ones for the same pod came first (it keeps the "
    "latest few per pod).")
RESYNC_POD_FAILURES = Counter(
    "phalanx_resync_pod_failures_total",
    "Pods whose admission failed during a gang-coordinator resync (logged once per pod; the others go on).")

# --- gang-coordinator's reconciler -------------------------------------------------------------
RECONCILER_FINDING_KINDS = (
    "reservation_without_pod", "stale_reservation", "pod_without_reservation", "pod_on_booked_gpus",
    "mig_without_reservation", "unreadable_record", "queue_usage_mismatch",
)
RECONCILER_FINDINGS = Gauge(
    "phalanx_reconciler_findings",
    "What the reconciler's last pass found where the ledger, phx-gangs and the cluster's bound pods disagree, by "
    "kind; 0 is healthy (docs/saga.md, The reconciler). Reported by the replica that holds the lease only.",
    ["finding"], allowed={"finding": RECONCILER_FINDING_KINDS})
RECONCILER_REPAIRS = Counter(
    "phalanx_reconciler_repairs_total",
    "Repairs the reconciler asked for: release (a reservation nobody uses), adopt (record one for a pod bound "
    "without it), forget (a member whose pod is gone), evict (of two pods sharing a GPU, the one bound later is "
    "deleted), report (a pod bound without a readable assignment, or on GPUs whose holder is gone: told).",
    ["action"], allowed={"action": ("release", "adopt", "forget", "evict", "report")})
RECONCILER_LEADER = Gauge(
    "phalanx_reconciler_leader", "1 while this gang-coordinator replica holds the reconciler lease, else 0.")
RECONCILER_PASSES = Counter("phalanx_reconciler_passes_total", "Reconciler passes completed (lease holder only).")

# --- topology-discovery -----------------------------------------------------------------------
TOPOLOGY_REPORTS = Counter("phalanx_topology_reports_total", "Topology reports published (changes only).")
HEARTBEAT_FAILURES = Counter("phalanx_topology_report_failures_total", "Topology report or heartbeat attempts that failed.")

# --- KV mirrors (phalanx_bus.mirror) -----------------------------------------------------------
KV_MIRROR_LISTINGS = Counter(
    "phalanx_kv_mirror_listings_total",
    "Times a KV mirror listed its bucket and applied the difference (once at start, again after every break), "
    "by bucket.", ["bucket"])
KV_MIRROR_UNDECODABLE = Counter(
    "phalanx_kv_mirror_undecodable_total",
    "KV values a mirror could not decode; the key is held as poisoned and never handed out, by bucket.", ["bucket"])
