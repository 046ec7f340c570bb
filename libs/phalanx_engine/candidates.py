"""One member on one node, as the single-member searches (``decide._place_one``,
``decide._place_share``) weigh it: refused, or its assignment with its rank.

Two shortcuts keep those searches from redoing work, neither changing what they find:

* a node that ``kube_plugins.resources_fit`` refuses is passed over without running the
  filters (when the profile runs ``NodeResourcesFit`` on the member, some filter refuses that
  node, whichever comes first; on a busy cluster most nodes a search visits are out of CPU or
  memory, and building each refusal's status was most of a decision's time);
* what a node said for a member's shape is kept on its state (``NodeState.memo``) until the
  state changes (``NodeState.take``): members of one shape are interchangeable (the plugins see
  the request, not the pod's identity), so another member of that shape gets the same answer,
  its assignment carrying its own pod. A node a plugin raised on is not remembered: it is
  evaluated, and its error logged, every time, as before. Nor is a member with ResourceClaims:
  its answer depends on devices other nodes' decisions take (a pool reaching several nodes) and
  on the claims decided so far, not on this node's state alone. Nor is a member pod
  (anti-)affinity may refuse nodes for (``podaffinity.relevant``): that answer depends on the
  pods of other nodes in the node's domain.
"""

from __future__ import annotations

from msgspec.structs import replace

from phalanx_engine import podaffinity
from phalanx_engine.framework import Member, Profile
from phalanx_engine.kube_plugins import NodeResourcesFit, resources_fit
from phalanx_engine.nodestate import NodeState
from phalanx_engine.status import Code, Status
from phalanx_proto.events import Assignment

MEMO_SHAPES = 256
"""Shapes remembered per node state (the memory is emptied past this)."""

Candidate = tuple[tuple, Assignment]


def checks_resources(profile: Profile, member: Member) -> bool:
    """Does ``profile`` run ``NodeResourcesFit`` on ``member`` (so ``resources_fit`` may refuse
    nodes for it)?"""
    return any(isinstance(f, NodeResourcesFit) for f in profile.filters_for(member))


def neg_name(name: str) -> tuple:
    return tuple(-ord(c) for c in name)


def candidate(profile: Profile, member: Member, st: NodeState, gate: bool) -> Candidate | None:
    """The member's assignment on ``st`` with its rank (higher is better; ties go to the
    smaller name), or None when a filter refuses the node. ``gate``: ``checks_resources``."""
    keeps = not member.spec.claims and not podaffinity.relevant(member.spec)
    kept = st.memo.get(member.shape) if keeps else None
    if kept is not None and kept[0] is profile:
        got = kept[1]
        if got is None or (got[1].pod == member.spec.pod and got[1].labels == member.spec.labels):
            return got
        # the shape leaves the labels out: the assignment is this member's, with its own
        return got[0], replace(got[1], pod=member.spec.pod, labels=member.spec.labels)
    if gate and not resources_fit(member, st):
        return _keep(profile, member, st, None, keeps)
    a = profile.evaluate(member, st)
    if isinstance(a, Status):
        return None if any(r.code is Code.NODE_ERROR for r in a.reasons) else _keep(profile, member, st, None, keeps)
    rank = profile.rank(member, st, a)
    return None if rank is None else _keep(profile, member, st, ((rank, neg_name(st.name)), a), keeps)


def _keep(profile: Profile, member: Member, st: NodeState, got: Candidate | None, keeps: bool) -> Candidate | None:
    if not keeps:
        return got
    if len(st.memo) >= MEMO_SHAPES:
        st.memo = {}
    st.memo[member.shape] = (profile, got)
    return got
