"""Streams, subjects, durable consumers and KV buckets: the addresses of the contract.

Subjects name their addressee, so each service's durable consumer filters on what it
handles and other systems can subscribe to any of them:

=============================  ======================================  ==================
subject                        events                                  consumed by
=============================  ======================================  ==================
``phx.gang.placement.<gang>``  PlacementRequested, ReleaseRequested    placement
``phx.gang.binder.<gang>``     BindRequested                           binder
``phx.gang.coord.<gang>``      Placed, PlacementFailed, Bound, …       gang-coordinator
``phx.gang.status.<gang>``     GangAdmitted, GangScheduled, …          subscribers
``phx.topology.<node>``        NodeTopologyReported                    subscribers (placement reads KV)
``phx.node.<node>.mig``        MigPrepareRequested, MigDestroyRequested mig-manager
``phx.node.<node>.reply``      MigReady, MigFailed, MigDestroyed       gang-coordinator
``phx.deadline.sched.<gang>``  GangDeadline (scheduled message)        (the server)
``phx.deadline.fired.<gang>``  GangDeadline (delivered at the time)    gang-coordinator
=============================  ======================================  ==================
"""

from __future__ import annotations

import re

STREAM_GANG = "PHX_GANG"
STREAM_TOPOLOGY = "PHX_TOPOLOGY"
STREAM_NODE = "PHX_NODE"
STREAM_DEADLINE = "PHX_DEADLINE"
STREAM_DEAD_LETTER = "PHX_DLQ"

KV_TOPOLOGY = "phx-topology"
KV_HEARTBEAT = "phx-heartbeat"
KV_LEDGER = "phx-ledger"
KV_GANGS = "phx-gangs"
KV_MIG = "phx-mig"
"""MIG ownership records, written by each node's mig-manager (``<node>.<gpu>.<start>``)."""
KV_LEASES = "phx-leases"
"""gang-coordinator's leases (one active reconciler) and the reconciler's last report."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(value: str) -> str:
    """A string made safe as one subject token or KV key token (lossy; routing only)."""
    return _UNSAFE.sub("_", value) or "_"


def gang_key(gang_id: str) -> str:
    """KV key of a gang in ``phx-gangs``: ``<namespace>.<name>`` made safe."""
    ns, _, name = gang_id.partition("/")
    return f"{token(ns)}.{token(name)}"


def placement_subject(gang_id: str) -> str:
    return f"phx.gang.placement.{gang_key(gang_id)}"


def binder_subject(gang_id: str) -> str:
    return f"phx.gang.binder.{gang_key(gang_id)}"


def coord_subject(gang_id: str) -> str:
    return f"phx.gang.coord.{gang_key(gang_id)}"


def status_subject(gang_id: str) -> str:
    return f"phx.gang.status.{gang_key(gang_id)}"


def topology_subject(node: str) -> str:
    return f"phx.topology.{token(node)}"


def mig_subject(node: str) -> str:
    return f"phx.node.{token(node)}.mig"


MIG_EVERY_NODE = "phx.node.*.mig"
"""Every node's MIG commands: the filter of a node fleet's single consumer (simulator only;
a real node's mig-manager filters on its own ``mig_subject``)."""


def node_of_mig_subject(subject: str) -> str:
    """The node token of a ``phx.node.<node>.mig`` subject ("" for any other subject)."""
    parts = subject.split(".")
    return parts[2] if len(parts) == 4 and parts[:2] == ["phx", "node"] and parts[3] == "mig" else ""


def node_reply_subject(node: str) -> str:
    return f"phx.node.{token(node)}.reply"


def deadline_schedule_subject(gang_id: str) -> str:
    """Where a gang's deadline is scheduled; one pending schedule per subject, so a new
    attempt's deadline replaces the previous one."""
    return f"phx.deadline.sched.{gang_key(gang_id)}"


def deadline_fired_subject(gang_id: str) -> str:
    """Where the server delivers the deadline; must be inside ``PHX_DEADLINE`` (the server
    refuses a schedule target outside the stream)."""
    return f"phx.deadline.fired.{gang_key(gang_id)}"


def dead_letter_subject(stream: str, consumer: str) -> str:
    return f"phx.dlq.{token(stream)}.{token(consumer)}"
