"""Values stored in the shared KV buckets: saga state (``phx-gangs``) and the ledger
(``phx-ledger``). They are part of the contract because ``phalanx explain`` and other systems
read them; like events they accept unknown fields and only grow fields with defaults.
"""

from __future__ import annotations

import msgspec

from phalanx_proto.events import Assignment, MemberSpec, Phase, PodRef


class Allocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One member's reservation on one node."""

    gang_id: str
    attempt: int
    assignment: Assignment


class NodeLedger(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every reservation on one node, keyed by ``alloc_key(pod)``. Written only by placement,
    always by compare-and-set on the KV revision it read, so no GPU is booked twice."""

    node: str
    allocations: dict[str, Allocation] = {}


def alloc_key(pod: PodRef) -> str:
    return f"{pod.namespace}/{pod.name}"


class GangState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The saga state of one gang, owned by gang-coordinator and updated by compare-and-set."""

    gang_id: str
    phase: Phase = "waiting"
    attempt: int = 0
    min_member: int = 1
    members: tuple[MemberSpec, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    bound: tuple[PodRef, ...] = ()
    reason: str = ""
    """Why the gang is not scheduled (yet): the pending reason its pods show."""
    fits_empty_cluster: bool = True
    """From the last PlacementFailed: could the gang fit the cluster with nothing reserved?"""
    created_at: float = 0.0
    updated_at: float = 0.0
    trace_id: str = ""
    priority: int = 0
    """``spec.priority`` of the members (the highest); orders the queue before arrival."""
    timeout_s: float = 0.0
    """Per-gang attempt deadline (pod annotation ``phalanx.io/gang-timeout-seconds``); 0: default."""
    min_member_declared: bool = True
    """False when no pod said min-member: the gang is the pods seen once the group is quiet."""
    last_member_at: float = 0.0
    attempt_started_at: float = 0.0
    """Unix time the current attempt started; its deadline is this + the timeout."""
    failures: int = 0
    """Failed attempts so far (drives the backoff)."""
    backoff_until: float = 0.0
    rollback_done: tuple[str, ...] = ()
    """Compensations of the current attempt already run (``unbind``, ``mig``, ``release``)."""
    unbound: tuple[PodRef, ...] = ()
    """Members deleted by the ``unbind`` compensation (so their deletion is not a new failure)."""


gang_state_decoder = msgspec.json.Decoder(GangState)
ledger_decoder = msgspec.json.Decoder(NodeLedger)
