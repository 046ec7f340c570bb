"""The wire contract: round trips, tolerance of unknown fields, stable tags, checked-in schemas."""

from __future__ import annotations

import json

import msgspec
import pytest

from phalanx_cli import cmd_schema
from phalanx_proto import dra as D
from phalanx_proto import events as E
from phalanx_proto import scheduling as S
from phalanx_proto.state import GangState, NodeLedger, gang_state_decoder

POD = E.PodRef(namespace="default", name="whole-card-demo", uid="u1")
ASSIGNMENT = E.Assignment(pod=POD, node="v100-a", gpus=(0, 1), gpu_uuids=("GPU-a", "GPU-b"))

SAMPLES = [
    E.GangAdmitted(gang_id="default/g", attempt=1, members=(POD,), min_member=1),
    E.PlaceRequested(gang_id="default/g", attempt=2, members_digest=E.uid_digest([POD])),
    E.Reserved(gang_id="default/g", attempt=3, members_digest=E.uid_digest([POD])),
    E.PlacementFailed(gang_id="default/g", summary="0/2 nodes are available: 2 insufficient free GPUs.",
                      reasons={"insufficient free GPUs": 2}),
    E.PlacementFailed(gang_id="default/g", attempt=2, summary="0/2 nodes are available: 2 insufficient free GPUs.",
                      whatif=E.WhatIf(answers=(E.Answer(probe="wait", text="would start if 2 GPUs free on node v100-a "
                                                        "(held by gang default/h)", gpus=2, tier="node",
                                                        domain="v100-a", holders=(E.Holder(gang_id="default/h",
                                                                                           queue="q", gpus=2),)),),
                                      spent_ms=1.5, decisions=4, cut=("fewer",))),
    E.BindPods(gang_id="default/g", pods=(POD,)),
    E.BindsDone(gang_id="default/g", bound=(POD,)),
    E.BindsDone(gang_id="default/g", failed=(E.BindFailure(pod=POD, reason="pod gone"),)),
    E.RollbackStarted(gang_id="default/g", reason="deadline"),
    E.ReleaseRequested(gang_id="default/g", reason="pod deleted", pods=(POD,)),
    E.Released(gang_id="default/g"),
    E.Preempting(gang_id="default/g", attempt=2, members_digest=E.uid_digest([POD]),
                 reason="preempting default/lo (priority 1, queue default, rule priority) to free 8 GPUs on n1",
                 nodes=("n1",)),
    E.GangScheduled(gang_id="default/g", assignments=(ASSIGNMENT, E.Assignment(
        pod=POD, node="n1", gpus=(0,), requests={"cpu": 4000}, host_ports=(S.HostPort(port=8080),)))),
    E.GangPending(gang_id="default/g", reason="gang incomplete"),
    E.GangDeadline(gang_id="default/g", attempt=3),
    E.UnreserveClaims(gang_id="default/g", attempt=3, held=(E.HeldClaims(pod=POD, claims=(D.ClaimAllocated(
        claim="default/c/u1", pod_claim="gpus", allocation=D.ClaimAllocation(devices=(D.AllocatedDevice(
            request="gpu", driver="gpu.nvidia.com", pool="n1", device="gpu-0"),)), gpus=(0,)),)),)),
    E.NodeHeartbeat(node="v100-a", generation=3, at=1.5),
    E.MigPrepareRequested(node="a100-a", gang_id="default/g", pod=POD, gpu=0, profile="3g.20gb", start=4),
    E.MigFailed(node="a100-a", gang_id="default/g", pod=POD, reason="no"),
    E.batch_of("placement-0-1-ab12cd", E.Reserved(gang_id="default/g", attempt=3), E.Released(gang_id="default/h"),
               traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    E.DecisionsRecorded(replica="placement-0-1-ab12cd", seq=7, at=1.5, base=True, items=(
        E.RecordedNode(name="n1", tiers=E.NetworkTiers(hypernode="hn0"), allocations=(ASSIGNMENT,), revision=4,
                       same=("kube",)),
        E.RecordedNode(name="n2", removed=True),
        E.RecordedDecision(gang_id="default/g", attempt=2, avoid=("n2",), placed=(ASSIGNMENT,)),
        E.RecordedDecision(gang_id="default/h", no_fit="0/2 nodes are available"))),
]

DECODERS = {E.GangEvent: E.gang_decoder, E.GangBatch: E.gang_decoder, E.TopologyEvent: E.topology_decoder, E.NodeEvent: E.node_decoder,
            E.DecisionsRecorded: E.decisions_decoder}


def decoder_for(event):
    return next(d for base, d in DECODERS.items() if isinstance(event, base))


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: E.tag_of(type(e)))
def test_every_event_survives_a_round_trip_through_its_stream_decoder(event):
    assert decoder_for(event).decode(E.encoder.encode(event)) == event


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: E.tag_of(type(e)))
def test_a_newer_sender_with_unknown_fields_is_still_understood(event):
    doc = json.loads(E.encoder.encode(event))
    doc["field_from_the_future"] = {"nested": [1, 2]}
    assert decoder_for(event).decode(json.dumps(doc)) == event


def test_tags_are_the_stable_names_subscribers_rely_on():
    assert [E.tag_of(t) for t in E.ALL_EVENTS] == [
        "gang.admitted", "placement.place", "gang.reserved", "gang.placement_failed", "bind.pods",
        "gang.binds_done", "gang.rollback", "placement.release_requested", "placement.adopt_requested",
            "gang.released",
        "gang.scheduled", "gang.pending", "gang.deadline", "binder.evict", "placement.eviction_refused",
        "binder.unreserve_claims", "gang.preempting", "gang.batch", "topology.reported", "topology.heartbeat", "mig.prepare_requested",
        "mig.destroy_requested", "mig.ready", "mig.failed", "mig.destroyed", "decisions.recorded",
    ]


def test_a_retired_tag_is_never_given_to_another_event():
    assert set(E.RETIRED_TAGS) & {E.tag_of(t) for t in E.ALL_EVENTS} == set()
    for tag in E.RETIRED_TAGS:
        with pytest.raises(msgspec.ValidationError, match=f"Invalid value '{tag}'"):
            E.gang_decoder.decode(json.dumps({"kind": tag, "gang_id": "g"}))


def test_the_kind_field_carries_the_tag_on_the_wire():
    doc = json.loads(E.encoder.encode(E.Released(gang_id="default/g", attempt=3)))
    assert doc == {"kind": "gang.released", "gang_id": "default/g", "attempt": 3}


def test_an_event_of_another_stream_is_refused_by_a_decoder():
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'topology.heartbeat'"):
        E.gang_decoder.decode(E.encoder.encode(E.NodeHeartbeat(node="n", at=1.0)))


def test_a_value_outside_its_limits_is_refused_with_the_field_named():
    bad = {"kind": "placement.place", "gang_id": "g", "attempt": 0}
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int` >= 1 - at `\$.attempt`"):
        E.gang_decoder.decode(json.dumps(bad))


@pytest.mark.parametrize(("member", "where"), [
    pytest.param({"tolerations": [{"key": f"k{i}"} for i in range(S.MAX_TOLERATIONS + 1)]}, "tolerations",
                 id="too many tolerations"),
    pytest.param({"host_ports": [{"port": p} for p in range(1, S.MAX_HOST_PORTS + 2)]}, "host_ports",
                 id="too many host ports"),
    pytest.param({"requests": {"cpu": -1}}, "requests", id="a negative request"),
    pytest.param({"node_affinity": [{"match_expressions": [{"key": "k", "operator": "Near"}]}]}, "node_affinity",
                 id="an unknown selector operator"),
])
def test_a_member_whose_constraints_break_the_contract_does_not_decode(member, where):
    """Members live in the gang's record (phx-gangs), the only place placement reads them from."""
    bad = {"gang_id": "g", "members": [{"pod": {"namespace": "n", "name": "p"}, **member}]}
    with pytest.raises(msgspec.ValidationError, match=rf"at `\$.members\[0\].{where}"):
        gang_state_decoder.decode(json.dumps(bad))


def test_idempotency_keys_differ_per_member_and_attempt():
    a = E.BindPods(gang_id="g", attempt=1, pods=(POD,))
    b = E.BindPods(gang_id="g", attempt=2, pods=(POD,))
    other = E.BindPods(gang_id="g", attempt=1, pods=(E.PodRef(namespace="default", name="other"),))
    assert len({a.key(), b.key(), other.key()}) == 3
    assert a.key() == E.BindPods(gang_id="g", attempt=1, pods=(POD,)).key()
    done = E.BindsDone(gang_id="g", attempt=1, bound=(POD,))
    failed = E.BindsDone(gang_id="g", attempt=1, failed=(E.BindFailure(pod=POD, reason="gone"),))
    assert done.key() != failed.key()


def test_a_recreated_pod_is_a_new_message_not_a_duplicate_of_the_old_one():
    old = E.PodRef(namespace="default", name="w-0", uid="u-old")
    new = msgspec.structs.replace(old, uid="u-new")
    member = E.MemberSpec(pod=old, gpus=1)
    pairs = [
        (E.BindPods(gang_id="g", attempt=1, pods=(old,)), E.BindPods(gang_id="g", attempt=1, pods=(new,))),
        (E.BindsDone(gang_id="g", attempt=1, bound=(old,)), E.BindsDone(gang_id="g", attempt=1, bound=(new,))),
        (E.PlaceRequested(gang_id="g", attempt=1, members_digest=E.uid_digest([member.pod])),
         E.PlaceRequested(gang_id="g", attempt=1, members_digest=E.uid_digest([new]))),
        (E.ReleaseRequested(gang_id="g", attempt=1, pods=(old,)), E.ReleaseRequested(gang_id="g", attempt=1, pods=(new,))),
        (E.MigReady(node="n", gang_id="g", attempt=1, pod=old, instance_uuid="m"),
         E.MigReady(node="n", gang_id="g", attempt=1, pod=new, instance_uuid="m")),
        (E.PlacementFailed(gang_id="g", attempt=1, members=(old,)), E.PlacementFailed(gang_id="g", attempt=1, members=(new,))),
    ]
    assert [a.key() != b.key() for a, b in pairs] == [True] * len(pairs)
    assert E.uid_digest([old, new]) == E.uid_digest([new, old])


def test_kv_values_round_trip():
    state = GangState(gang_id="default/g", phase="binding", attempt=2, members=(E.MemberSpec(pod=POD, gpus=1),),
                      bound=(POD,))
    assert gang_state_decoder.decode(E.encoder.encode(state)) == state
    assert msgspec.json.decode(E.encoder.encode(NodeLedger(node="n")), type=NodeLedger) == NodeLedger(node="n")


def test_checked_in_schemas_match_the_code():
    docs = cmd_schema.documents()
    stale = [n for n, text in docs.items() if not (cmd_schema.DEFAULT_DIR / n).is_file()
             or (cmd_schema.DEFAULT_DIR / n).read_text() != text]
    assert stale == [], "run `phalanx schema` and commit proto/schema/"
    assert sorted(p.name for p in cmd_schema.DEFAULT_DIR.glob("*.json")) == sorted(docs)


def test_what_if_answers_beyond_the_wire_bounds_do_not_decode_and_bounded_brings_them_within():
    holders = tuple(E.Holder(gang_id=f"ns/g{i}", gpus=1) for i in range(E.MAX_HOLDERS + 3))
    answer = E.Answer(probe="wait", text="x" * (E.MAX_ANSWER_TEXT + 10), holders=holders,
                      assignments=(ASSIGNMENT,))
    big = E.PlacementFailed(gang_id="g", attempt=1, whatif=E.WhatIf(answers=(answer,) * (E.MAX_ANSWERS + 1)))
    with pytest.raises(msgspec.ValidationError, match=r"\$.whatif.answers"):
        E.gang_decoder.decode(E.encoder.encode(big))
    fitted = msgspec.structs.replace(big, whatif=big.whatif.bounded())
    got = E.gang_decoder.decode(E.encoder.encode(fitted))
    assert got == fitted
    assert len(got.whatif.answers) == E.MAX_ANSWERS
    first = got.whatif.answers[0]
    assert (len(first.text), first.text[-3:], first.holders, first.assignments) == (
        E.MAX_ANSWER_TEXT, "...", holders[:E.MAX_HOLDERS], ())


def test_a_gang_record_written_before_what_if_answers_existed_still_decodes():
    old = b'{"gang_id":"default/g","phase":"backoff","attempt":2,"reason":"0/2 nodes"}'
    assert gang_state_decoder.decode(old).whatif is None
