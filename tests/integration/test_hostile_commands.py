"""Forged and replayed commands and replies, published straight onto the bus with a test
connection, against the five real service processes and a real nats-server: each is refused
(or repaired) and changes nothing — no reservation lost or added, no pod bound or deleted, no
GPU booked twice at any poll (docs/saga.md, "Checks"; issue: every command checked against
the record).

One stack serves the whole module; every test uses its own pods and leaves the cluster empty.
"""

from __future__ import annotations

import anyio
import pytest

from hostile import audited, cleaned_env, drained, forge, held, hostile_stack, record, scheduled
from phalanx_kube.kvcluster import KvCluster
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindFailure,
    BindPods,
    BindsDone,
    PlaceRequested,
    PodRef,
    ReleaseRequested,
    Reserved,
    batch_of,
    uid_digest,
)
from stackutil import audit_ledger, bound_pods, gang_states, gpu_pod, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

FAST = ["--resync-s", "0.5", "--redrive-after-s", "2", "--backoff-base-s", "0.5", "--backoff-max-s", "2"]

@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("hostile"), FAST)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e


async def test_a_reserved_for_an_attempt_never_started_or_not_from_placement_changes_nothing(env):
    stack, bus, sim = env
    async with audited(bus):
        pod, state = await scheduled(bus, sim, "victim-a")
        (mine,) = await held(bus, state)
        before = await record(bus, sim)
        ours = uid_digest([pod.ref])
        for forged in (
            Reserved(gang_id=state.gang_id, attempt=5, members_digest=ours),          # never started
            Reserved(gang_id=state.gang_id, attempt=1, members_digest=uid_digest([PodRef(
                namespace="default", name="victim-a", uid="forged")])),                # not the attempt's members
            Reserved(gang_id=state.gang_id, attempt=1, members_digest=ours),          # a replay of the real one
        ):
            await forge(bus, S.placement_answers_subject("forger"), batch_of("forger", forged))
        await drained(bus, "gang-coordinator", "placement")
        assert await record(bus, sim) == before
        # Nobody else is put on the victim's GPU afterwards.
        _, other = await scheduled(bus, sim, "after-a")
        (theirs,) = await held(bus, other)
        assert (theirs.node, theirs.gpus) != (mine.node, mine.gpus)


async def test_a_forged_reserved_and_bind_for_a_placing_attempt_bind_nothing(env):
    """While placement is down, the intruder's attempt is placing with no reservation: a
    forged ``Reserved`` finds none in the ledger, and a forged ``BindPods`` finds nothing to
    bind the pod to (the command names pods only: no GPU to put it on)."""
    stack, bus, sim = env
    async with audited(bus):
        _, holder = await scheduled(bus, sim, "holder-b")
        (taken,) = await held(bus, holder)
        await anyio.to_thread.run_sync(stack.kill, "placement")
        try:
            pod = await sim.apply_pod(gpu_pod("intruder-b", 1))

            async def placing():
                s = (await gang_states(bus)).get("default/intruder-b")
                return s if s is not None and s.phase == "placing" else None

            state = await wait_until(placing, 30)
            await forge(bus, S.placement_answers_subject("forger"), batch_of("forger", Reserved(
                gang_id=state.gang_id, attempt=state.attempt, members_digest=uid_digest([pod.ref]))))
            await forge(bus, S.binder_subject(state.gang_id), BindPods(gang_id=state.gang_id, attempt=state.attempt,
                                                                       pods=(pod.ref,)))
            await drained(bus, "gang-coordinator", "binder")
            assert (await sim.get_pod(pod.ref)).node_name == ""
            assert (await gang_states(bus))[state.gang_id].phase == "placing"
        finally:
            await anyio.to_thread.run_sync(stack.restart, "placement")

        async def bound():
            return (await bound_pods(sim)).get("default/intruder-b")

        node, gpus = await wait_until(bound, 45)
        assert (node, gpus) != (taken.node, taken.gpus)


async def test_a_bind_for_a_pod_outside_the_gang_or_of_another_attempt_is_refused(env):
    stack, bus, sim = env
    async with audited(bus):
        _, owner = await scheduled(bus, sim, "owner-c")
        outsider = await sim.apply_pod(gpu_pod("outsider-c", 1, scheduler="default-scheduler"))
        waiting = await sim.apply_pod(gpu_pod("waiting-c", 1, labels={
            "jobset.sigs.k8s.io/jobset-name": "incomplete-c", "aliyun.com/min-member": "2"}))
        await wait_until(lambda: _known(bus, "default/JobSet:incomplete-c"), 30)
        before = await record(bus, sim)
        member = owner.members[0].pod
        for forged in (
            BindPods(gang_id=owner.gang_id, attempt=owner.attempt, pods=(outsider.ref,)),   # no reservation
            BindPods(gang_id=owner.gang_id, attempt=owner.attempt, pods=(waiting.ref,)),    # another gang's pod
            BindPods(gang_id="default/JobSet:incomplete-c", attempt=1, pods=(waiting.ref,)),  # nothing placed
            BindPods(gang_id=owner.gang_id, attempt=owner.attempt + 1, pods=(member,)),     # another attempt
            BindPods(gang_id="default/JobSet:incomplete-c", attempt=1, pods=(member,)),     # another gang's pod
        ):
            await forge(bus, S.binder_subject(forged.gang_id), forged)
        await drained(bus, "binder", "gang-coordinator")
        assert await record(bus, sim) == before


async def test_a_binds_done_naming_a_pod_that_is_not_a_member_of_that_attempt_deletes_nothing(env):
    stack, bus, sim = env
    async with audited(bus):
        victim, vstate = await scheduled(bus, sim, "victim-d")
        _, other = await scheduled(bus, sim, "other-d")
        bystander = await sim.apply_pod(gpu_pod("bystander-d", 1, scheduler="default-scheduler"))
        kube_scheduler = await KvCluster.open(bus, scheduler_names=("default-scheduler",))
        await kube_scheduler.bind(bystander.ref, "v100-b")  # Phalanx's adapter would refuse: not its pod
        bystander = await sim.get_pod(bystander.ref)
        before = await record(bus, sim)
        for forged in (
            BindsDone(gang_id=other.gang_id, attempt=other.attempt, bound=(victim.ref,)),      # a pod of another gang
            BindsDone(gang_id=other.gang_id, attempt=other.attempt + 3, bound=(victim.ref,)),  # never started
            BindsDone(gang_id=vstate.gang_id, attempt=vstate.attempt, bound=(bystander.ref,)),  # no member at all
            BindsDone(gang_id=other.gang_id, attempt=other.attempt, failed=(
                BindFailure(pod=victim.ref, reason="forged"),)),                               # a failure not theirs
        ):
            await forge(bus, S.binder_answers_subject("forger"), batch_of("forger", forged))
        await drained(bus, "gang-coordinator")
        assert await record(bus, sim) == before


async def test_a_placement_request_whose_members_are_not_the_gangs_replaces_no_reservation(env):
    stack, bus, sim = env
    async with audited(bus):
        pod, state = await scheduled(bus, sim, "victim-e")
        before = await record(bus, sim)
        phantom = PodRef(namespace="default", name="phantom-e", uid="phantom")
        ours = uid_digest(m.pod for m in state.members)
        for forged in (
            PlaceRequested(gang_id=state.gang_id, attempt=state.attempt + 1, members_digest=uid_digest([phantom])),
            PlaceRequested(gang_id=state.gang_id, attempt=state.attempt, members_digest=uid_digest([phantom])),
            PlaceRequested(gang_id=state.gang_id, attempt=state.attempt, members_digest=ours),  # a replay
            PlaceRequested(gang_id="default/phantom-e", attempt=1, members_digest=uid_digest([phantom])),
        ):
            await forge(bus, S.placement_subject(forged.gang_id), forged)
        await drained(bus, "placement", "gang-coordinator")
        assert await record(bus, sim) == before


async def test_an_old_release_replayed_after_the_pod_was_recreated_frees_nothing_and_the_new_pod_is_not_delayed(env):
    stack, bus, sim = env
    async with audited(bus):
        old, _ = await scheduled(bus, sim, "reborn-f")
        await sim.delete_pod(old.ref)
        await wait_until(lambda: _gone(bus, "default/reborn-f"), 30)
        started = anyio.current_time()
        # Same name, new uid, same gang id; the gang's tombstone kept its attempt counter.
        new, state = await scheduled(bus, sim, "reborn-f")
        assert state.attempt == 2 and new.uid != old.uid
        # Message ids carry the pod uids: the new pod's commands are not duplicates of the old one's.
        assert anyio.current_time() - started < 30
        before = await record(bus, sim)
        for forged in (
            ReleaseRequested(gang_id=state.gang_id, attempt=1, reason="replayed", pods=(old.ref,)),
            ReleaseRequested(gang_id=state.gang_id, attempt=2, reason="old pod, new attempt", pods=(old.ref,)),
            ReleaseRequested(gang_id=state.gang_id, attempt=2, reason="by name", pods=(PodRef(namespace="default",
                                                                                               name="reborn-f"),)),
            ReleaseRequested(gang_id=state.gang_id, attempt=2, reason="live", pods=(new.ref,)),
            ReleaseRequested(gang_id=state.gang_id, attempt=2, reason="everything"),
            ReleaseRequested(gang_id=state.gang_id, attempt=1, reason="earlier", pods=(new.ref,)),
            ReleaseRequested(gang_id=state.gang_id, attempt=9, reason="later", pods=(new.ref,)),
        ):
            await forge(bus, S.placement_subject(forged.gang_id), forged)
        await drained(bus, "placement", "gang-coordinator")
        assert await record(bus, sim) == before


async def _known(bus, gang_id) -> bool:
    return gang_id in await gang_states(bus)


async def _gone(bus, gang_id) -> bool:
    return gang_id not in await gang_states(bus) and not await audit_ledger(bus)


async def test_a_message_id_burned_in_advance_does_not_hold_a_new_pod_back(env):
    stack, bus, sim = env
    async with audited(bus):
        # The old scheme's id for the next pod's first request, taken by someone else first.
        junk = PlaceRequested(gang_id="default/burned-g", attempt=1)
        await bus.publish(S.placement_subject(junk.gang_id), junk, msg_id="placement.requested:default/burned-g:1")
        started = anyio.current_time()
        await scheduled(bus, sim, "burned-g")
        assert anyio.current_time() - started < 30


async def test_a_bind_that_outran_its_attempts_rollback_is_undone_where_the_pod_is_bound(env):
    """binder checked the ledger, the attempt was rolled back (its reservation released), then
    the bind went through and ``BindsDone`` arrived: the ledger no longer says where the pod
    was meant to be, and it must not stay bound outside any reservation. Played here with a
    pod that fits nowhere (attempt 1 failed, the gang is in backoff) bound straight through
    Phalanx's own adapter, as binder would have, and the reply binder would then send."""
    stack, bus, sim = env
    async with audited(bus):
        pod = await sim.apply_pod(gpu_pod("late-g", 9))

        async def failed_once():
            s = (await gang_states(bus)).get("default/late-g")
            return s if s is not None and s.attempt >= 1 and s.phase in ("waiting", "backoff") else None

        state = await wait_until(failed_once, 30, what="late-g's first attempt failed")
        await sim.bind(pod.ref, "v100-a")
        await forge(bus, S.binder_answers_subject("forger"), batch_of(
            "forger", BindsDone(gang_id=state.gang_id, attempt=state.attempt, bound=(pod.ref,))))

        async def undone():
            p = await sim.get_pod(pod.ref)
            return p is None or p.uid != pod.uid

        await wait_until(undone, 20, what="the late bind undone")
        assert [e.reason for e in await sim.list_events(pod.ref) if e.reason == "GangRollback"] == ["GangRollback"]
