"""Preemption on the real stack (nats-server with auth and TLS, every service its own process,
the simulated cluster of 2 × 8 V100): a full cluster of low-priority gangs, a high-priority
gang arrives; placement nominates GPUs and names the victims, binder evicts exactly those
gangs, whole, through the (simulated) Eviction API, gang-coordinator rolls them back, and the
preemptor binds to the GPUs they freed. A victim whose disruption budget refuses the eviction
is evicted not at all: the nomination is dropped and the planner chooses other victims.
"""

from __future__ import annotations

import json

import anyio
import pytest

from hostile import audited, cleaned_env, hostile_stack, scrape
from phalanx_placement.testhooks import DROP_EVICTIONS_ENV
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, DISRUPTION_BUDGET_ANNOTATION
from phalanx_proto.state import Nomination, gang_state_decoder, ledger_decoder
from stackutil import gang_pod, ledger, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--resync-s", "0.5", "--backoff-base-s", "1", "--backoff-max-s", "5", "--reconcile-s", "1"]
LOW = {"lo-x": 1, "lo-y": 2}
"""Two gangs of 2 × 4 GPUs fill the 16 GPUs; lo-x has the lower priority."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("preemption"), COORD)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e


@pytest.fixture(scope="module")
def dropping_stack(tmp_path_factory):
    """A stack whose placement does not send its first eviction command (a test hook), as if it
    had stopped between committing the nomination and sending it."""
    yield from hostile_stack(tmp_path_factory.mktemp("preemption-dropped"), COORD, env={DROP_EVICTIONS_ENV: "1"})


@pytest.fixture
async def dropping(dropping_stack):
    async for e in cleaned_env(dropping_stack):
        yield e


async def fill(sim, protect: str = "") -> dict[str, tuple[str, tuple[int, ...]]]:
    """Both low-priority gangs bound; pod → (node, GPUs). ``protect``: a gang whose pods'
    disruption budget allows no eviction."""
    for gang, prio in LOW.items():
        for i in range(2):
            annotations = {DISRUPTION_BUDGET_ANNOTATION: "0"} if gang == protect else None
            await sim.apply_pod(gang_pod(f"{gang}-{i}", 4, gang, 2, priority=prio, annotations=annotations))

    async def all_bound():
        pods = {p.name: p for p in await sim.list_pods()}
        if len(pods) == 4 and all(p.node_name for p in pods.values()):
            return {n: (p.node_name, tuple(json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["gpus"]))
                    for n, p in pods.items()}
        return None

    return await wait_until(all_bound, 60, what="the low-priority gangs bound")


async def preempt(bus, sim, phases: list[tuple[str, int]] | None = None) -> tuple[dict, list[Nomination], set[str]]:
    """Submit the 8-GPU priority-10 gang and wait until it is bound, watching the ledger and the
    gang records meanwhile (it may all take a fraction of a second): its pod, every nomination
    written and every reason its record gave; ``phases``: filled with each (phase, attempt) its
    record went through."""
    seen: list[Nomination] = []
    reasons: set[str] = set()
    phases = phases if phases is not None else []

    async def follow(bucket: str, keys: str, decoder, take) -> None:
        async for entry in (await bus.kv(bucket)).watch(keys):
            if entry is not None and not entry.deleted and entry.value:
                take(decoder.decode(entry.value))

    def nominations(led) -> None:
        seen.extend(n for n in led.nominations.values() if n not in seen)

    def reason(s) -> None:
        if s.members and s.members[0].pod.name == "hi-0":
            if s.reason:
                reasons.add(s.reason)
            if not phases or phases[-1] != (s.phase, s.attempt):
                phases.append((s.phase, s.attempt))

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow, S.KV_LEDGER, "*", ledger_decoder, nominations)
        tg.start_soon(follow, S.KV_GANGS, ">", gang_state_decoder, reason)
        await anyio.sleep(0.5)  # the watches are listed
        await sim.apply_pod(gang_pod("hi-0", 8, "hi", 1, priority=10))

        async def bound():
            pod = await sim.get_pod(ref("hi-0"))
            return pod if pod is not None and pod.node_name else None

        pod = await wait_until(bound, 90, what="the preemptor bound")
        await anyio.sleep(0.5)  # the watches have seen the last writes
        tg.cancel_scope.cancel()
    return pod, seen, reasons


async def test_a_high_priority_gang_evicts_exactly_the_planned_victims_whole_and_binds_to_their_gpus(env):
    stack, bus, sim = env
    phases: list[tuple[str, int]] = []
    async with audited(bus):
        before = await fill(sim)
        pod, noms, reasons = await preempt(bus, sim, phases)
    # the attempt stayed open: one attempt, preempting until its nomination became its reservation,
    # no backoff and no second attempt (docs/preemption.md, "The attempt stays open")
    assert ("preempting", 1) in phases, phases
    assert {a for _, a in phases} == {1} and not any(p == "backoff" for p, _ in phases), phases
    victims = {v for n in noms for v in n.victims}
    assert victims, "a nomination named the victims before the preemptor was placed"
    assert all(n.victims == {"default/JobSet:lo-x": "priority"} for n in noms), noms
    assert any(r.startswith("preempting default/JobSet:lo-x (priority 1, queue default, rule priority) to free 8 GPUs")
               for r in reasons), reasons
    left = {p.name: p for p in await sim.list_pods()}
    # exactly the victim gang's pods were evicted, every one of them; the other gang runs on as it was
    assert sorted(n for n in before if n not in left) == ["lo-x-0", "lo-x-1"]
    assert {n: (p.node_name, tuple(json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["gpus"]))
            for n, p in left.items() if n != "hi-0"} == {n: before[n] for n in ("lo-y-0", "lo-y-1")}
    # the preemptor took the GPUs it was nominated, which are those the victims freed
    got = (pod.node_name, tuple(sorted(json.loads(pod.annotations[ASSIGNMENT_ANNOTATION])["gpus"])))
    assert {(n.assignment.node, tuple(sorted(n.assignment.gpus))) for n in noms} == {got}
    freed = sorted(g for n in ("lo-x-0", "lo-x-1") if before[n][0] == got[0] for g in before[n][1])
    assert list(got[1]) == freed
    # nominations end with the reservation; the victims' pods were told who preempted them
    assert not any(led.nominations for led in (await ledger(bus)).values())
    events = await sim.list_events(ref("lo-x-0"))
    assert any(e.reason == "Preempted" and "default/JobSet:hi" in e.message and "rule priority" in e.message
               for e in events), events
    placement = await anyio.to_thread.run_sync(scrape, stack, "placement")
    binder = await anyio.to_thread.run_sync(scrape, stack, "binder")
    assert placement.get('phalanx_preemptions_total{rule="priority"}') == 1
    assert placement.get('phalanx_preempted_gpus_total{rule="priority"}') == 8
    assert placement.get("phalanx_preemptions_promoted_total") == 1
    assert binder.get('phalanx_evictions_total{result="evicted"}') == 2


async def test_a_victim_whose_disruption_budget_refuses_is_not_evicted_and_the_planner_chooses_again(env):
    stack, bus, sim = env
    binder_before = await anyio.to_thread.run_sync(scrape, stack, "binder")
    async with audited(bus):
        before = await fill(sim, protect="lo-x")
        pod, noms, reasons = await preempt(bus, sim)
    # first lo-x (the lowest priority) was nominated, its budget refused, nothing of it was evicted;
    # then lo-y was chosen instead and evicted whole
    assert [dict(n.victims) for n in noms if n.attempt == min(m.attempt for m in noms)][0] == {
        "default/JobSet:lo-x": "priority"}
    assert any(n.victims == {"default/JobSet:lo-y": "priority"} for n in noms), noms
    left = {p.name for p in await sim.list_pods()}
    assert left == {"lo-x-0", "lo-x-1", "hi-0"}
    assert pod.node_name in {before["lo-y-0"][0], before["lo-y-1"][0]}
    hi_events = await sim.list_events(ref("hi-0"))
    assert any(e.reason == "PreemptionBlocked" and "disruption budget" in e.message for e in hi_events), hi_events
    placement = await anyio.to_thread.run_sync(scrape, stack, "placement")
    binder = await anyio.to_thread.run_sync(scrape, stack, "binder")
    assert placement.get("phalanx_preemptions_refused_total", 0) >= 1
    assert binder.get('phalanx_evictions_total{result="refused"}', 0) > binder_before.get(
        'phalanx_evictions_total{result="refused"}', 0)


async def test_a_gang_that_never_preempts_waits_and_explain_names_the_gang_preemption_would_take(env):
    stack, bus, sim = env
    before = await fill(sim)
    # its own gang name: placement remembers, per preemptor, victims whose eviction was refused
    calm = gang_pod("calm-0", 8, "calm", 1, priority=10)
    calm["spec"]["preemptionPolicy"] = "Never"
    await sim.apply_pod(calm)
    kv = await bus.kv(S.KV_GANGS)

    async def answered():
        for key in await kv.keys():
            entry = await kv.get(key)
            s = gang_state_decoder.decode(entry.value) if entry is not None and entry.value else None
            if s is not None and s.members and s.members[0].pod.name == "calm-0" and s.whatif is not None:
                got = [a for a in s.whatif.answers if a.probe == "preempt"]
                if got:
                    return s, got
        return None

    record, got = await wait_until(answered, 60, what="the never-preempting gang's what-if answers")
    assert [(a.text, a.starts) for a in got] == [
        ("would start if gang(s) default/JobSet:lo-x were preempted; not done: its pods' preemptionPolicy is Never: "
         "it waits and never preempts", False)]
    # it waits: nothing was evicted, nothing nominated, and its reason's what-if line is not the preemption
    assert {p.name: p.node_name for p in await sim.list_pods()} == {**{n: v[0] for n, v in before.items()},
                                                                   "calm-0": ""}
    assert not any(led.nominations for led in (await ledger(bus)).values())
    assert "preempted" not in record.reason


async def test_a_nomination_whose_eviction_was_never_sent_is_finished_by_placements_nomination_pass(dropping):
    stack, bus, sim = dropping
    phases: list[tuple[str, int]] = []
    async with audited(bus):
        before = await fill(sim)
        pod, noms, reasons = await preempt(bus, sim, phases)
    # the first plan's command was never sent; placement's nomination pass, finding the victims
    # still holding, sent it again and they were evicted whole: nothing else, no second plan, and
    # the preemptor's attempt stayed open meanwhile
    assert {a for _, a in phases} == {1}, phases
    assert "preempting did not start it" not in stack.procs["placement"].log_path.read_text()
    log = stack.procs["placement"].log_path.read_text()
    assert log.count("test hook: the eviction is not sent") == 1
    assert {tuple(n.victims) for n in noms} == {("default/JobSet:lo-x",)}, noms
    assert any(r.startswith("waiting for the preempted gang(s) default/JobSet:lo-x") for r in reasons), reasons
    left = {p.name for p in await sim.list_pods()}
    assert left == {"lo-y-0", "lo-y-1", "hi-0"}
    assert pod.node_name in {before["lo-x-0"][0], before["lo-x-1"][0]}
    binder = await anyio.to_thread.run_sync(scrape, stack, "binder")
    assert binder.get('phalanx_evictions_total{result="evicted"}') == 2
