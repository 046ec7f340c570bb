"""Traces as a real OTLP receiver (Jaeger v2, built by tools/traces/build.sh) gets them.

The five service processes run with nothing but the standard variables
(``OTEL_TRACES_EXPORTER=otlp``, ``OTEL_EXPORTER_OTLP_ENDPOINT``); the test then reads Jaeger's
query API and checks that a gang attempt is ONE trace whose spans nest the way the saga runs:

    gang-coordinator  publish phx.gang.placement.{replica}       (PRODUCER, PlaceRequested)
    placement           process phx.gang.placement.{replica}      (CONSUMER)
    placement             placement.decide                        (gang, attempt, nodes, GPUs)
    placement             placement.commit                        (the ledger batch)
    placement             publish phx.gang.coord.answers.{replica} (PRODUCER, Reserved)
    gang-coordinator        process phx.gang.coord.answers.{replica} (CONSUMER)
    gang-coordinator          … publish phx.gang.binder.{replica} (PRODUCER, BindPods)
    binder                      process phx.gang.binder.{replica} (CONSUMER)
    binder                        binder.bind                     (k8s.pod.name, k8s.namespace.name, k8s.node.name)
    binder                        publish phx.gang.coord.bound.{replica} (PRODUCER, BindsDone)

These commands and answers travel in batches (docs/events.md, "Batches"); each event in a batch
has its own publish span in its gang's trace and its own process span, so the trace reads as if
it had travelled alone. A command re-sent under its own message id (a retried attempt) goes on
its gang's subject (``phx.gang.placement.{gang}``) instead; both are accepted below.

Spans the gang-coordinator adds of its own (an attempt root span, saga-step spans) may sit
above or between the coordinator's publish/process spans: the test only requires the trace's
root to come from gang-coordinator and walks ancestors where the coordinator is in between.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from jaegerharness import Jaeger, JaegerMissing, Span, Trace

from phalanx_bus import Bus
from phalanx_kube.kvcluster import KvCluster
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from phalanx_proto.events import PodRef
from phalanx_proto.state import GangState, gang_state_decoder

pytestmark = [pytest.mark.traces, pytest.mark.anyio]

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "2x8v100.yaml"

COORD, PLACEMENT, BINDER = "phalanx-gang-coordinator", "phalanx-placement", "phalanx-binder"


def gpu_pod(name: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "phalanx", "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory):
    try:
        j, missing = Jaeger(tmp_path_factory.mktemp("jaeger")), ""
    except JaegerMissing as e:
        j, missing = None, str(e)
    if j is None:
        pytest.fail(missing, pytrace=False)  # never skip: say how to build it
    j.start()
    yield j
    j.stop()


@pytest.fixture(scope="module")
def stack(jaeger, tmp_path_factory):
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path_factory.mktemp("stack")),
              env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                   "OTEL_BSP_SCHEDULE_DELAY": "200"})
    s.start_nats()

    async def seed() -> None:
        bus = await Bus.connect(s.url, service="test")
        try:
            await bus.declare()
            sim = await KvCluster.open(bus)
            for node in s.cluster.node_objects():
                await sim.apply_node(node)
        finally:
            await bus.close()

    anyio.run(seed)
    try:
        s.start_services()
        yield s
    finally:
        s.stop()


async def _session(stack):
    bus = await Bus.connect(stack.url, service="test")
    await bus.declare()
    return bus, await KvCluster.open(bus)


async def _poll(what: str, probe, timeout: float = 45.0, interval: float = 0.5):
    """``await probe()`` until it returns something truthy; fail with its last diagnosis."""
    last = None
    with anyio.move_on_after(timeout):
        while True:
            result, last = await probe()
            if result:
                return result
            await anyio.sleep(interval)
    pytest.fail(f"{what}: not seen within {timeout:.0f}s\n{last}", pytrace=False)


async def _gang_of(bus: Bus, ref: PodRef, want) -> GangState:
    kv = await bus.kv(S.KV_GANGS)

    async def probe():
        for e in await kv.items():
            st = gang_state_decoder.decode(e.value)
            if any(m.pod.namespace == ref.namespace and m.pod.name == ref.name for m in st.members) and want(st):
                return st, None
        return None, f"no gang state for {ref} matching the condition"

    return await _poll(f"gang state of {ref}", probe)


async def _trace_with(jaeger: Jaeger, service: str, operation: str, tags: dict, complete) -> tuple[Trace, Span]:
    """The full trace holding span ``operation`` of ``service`` with ``tags``, once ``complete(trace,
    span)`` returns None (it returns what is still missing otherwise)."""

    async def probe():
        hits = await anyio.to_thread.run_sync(lambda: jaeger.traces(service, operation=operation, tags=tags))
        if not hits:
            return None, f"no {operation} span of {service} with {tags}; services: {jaeger.services()}"
        last = ""
        for hit in hits:
            full = await anyio.to_thread.run_sync(jaeger.trace, hit.trace_id)
            for span in full.find(name=operation, service=service, tags=tags):
                missing = complete(full, span)
                if missing is None:
                    return (full, span), None
                last = f"{missing}\ntrace {full.trace_id}:\n{full.outline()}"
        return None, last

    return await _poll(f"trace with {service} {operation} {tags}", probe)


def _one(spans: list[Span], what: str) -> Span:
    assert spans, f"no {what}"
    return spans[0]


def _consumer(trace: Trace, span: Span | None, service: str, group: str) -> Span | None:
    """``span`` if it is the CONSUMER span of durable ``group`` in ``service``, else None."""
    if span is None or span.service != service or span.kind != "consumer":
        return None
    return span if span.tags.get("messaging.consumer.group.name") == group else None


def _producer(span: Span | None, service: str, event: str) -> Span | None:
    if span is None or span.service != service or span.kind != "producer":
        return None
    return span if span.tags.get("phalanx.event") == event else None


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


async def test_a_scheduled_gang_is_one_trace_through_placement_and_binder_in_saga_order(stack, jaeger):
    bus, sim = await _session(stack)
    ref = PodRef(namespace="default", name="traced-4gpu")
    try:
        await sim.apply_pod(gpu_pod(ref.name, 4))
        state = await _gang_of(bus, ref, lambda s: s.phase == "scheduled")
        pod = await sim.get_pod(ref)
        node = pod.node_name
        gpus = json.loads(pod.annotations["phalanx.io/assignment"])["gpus"]
    finally:
        await bus.close()

    def complete(trace: Trace, bind: Span) -> str | None:
        """The chain from the bind span up to the coordinator's placement command."""
        pb = _consumer(trace, trace.parent(bind), BINDER, "binder")
        if pb is None:
            return "binder.bind is not the child of binder's process span"
        sb = _producer(trace.parent(pb), COORD, "bind.pods")
        if sb is None:
            return "binder's process span is not the child of gang-coordinator's BindPods publish"
        cp = next((a for a in trace.ancestors(sb) if _consumer(trace, a, COORD, "gang-coordinator")), None)
        if cp is None:
            return "BindPods was not published while gang-coordinator processed a reply"
        sp = _producer(trace.parent(cp), PLACEMENT, "gang.reserved")
        if sp is None:
            return "gang-coordinator's process span is not the child of placement's Reserved publish"
        pp = _consumer(trace, trace.parent(sp), PLACEMENT, "placement")
        if pp is None:
            return "Reserved was not published from placement's process span"
        if _producer(trace.parent(pp), COORD, "placement.place") is None:
            return "placement's process span is not the child of gang-coordinator's PlaceRequested publish"
        if not trace.find(name="placement.decide", service=PLACEMENT) or not trace.find(
                name="placement.commit", service=PLACEMENT):
            return "placement.decide / placement.commit not (yet) in the trace"
        if not [s for s in trace.spans if _producer(s, BINDER, "gang.binds_done") and pb in trace.ancestors(s)]:
            return "binder's BindsDone publish not (yet) in the trace"
        return None

    trace, bind = await _trace_with(jaeger, BINDER, "binder.bind", {"k8s.pod.name": ref.name}, complete)
    outline = f"\n{trace.outline()}"

    # binder: the bind span says which pod went where.
    assert (bind.tags["k8s.pod.name"], bind.tags["k8s.namespace.name"], bind.tags["k8s.node.name"]) == (
        ref.name, ref.namespace, node), outline
    assert bind.tags["phalanx.gang"] == state.gang_id and bind.tags["phalanx.attempt"] == state.attempt, outline

    # placement: decide and commit are children of the placement process span, which is the
    # child of gang-coordinator's command; the decision names the node and the GPUs.
    decide = _one(trace.find(name="placement.decide", service=PLACEMENT, tags={"phalanx.gang": state.gang_id}),
                  "placement.decide span")
    commit = _one(trace.find(name="placement.commit", service=PLACEMENT, tags={"phalanx.gang": state.gang_id}),
                  "placement.commit span")
    process_placement = trace.parent(decide)
    assert _consumer(trace, process_placement, PLACEMENT, "placement") is not None, outline
    assert trace.parent(commit) == process_placement, outline
    placement_templates = {S.CHANNEL["gangPlacementBatch"].template, S.CHANNEL["gangPlacement"].template}
    assert process_placement.name.removeprefix("process ") in placement_templates, outline
    command = trace.parent(process_placement)
    assert _producer(command, COORD, "placement.place") is not None, outline
    assert command.name.removeprefix("publish ") in placement_templates, outline
    assert command.tags["messaging.destination.template"] == command.name.removeprefix("publish "), outline
    assert command.tags["messaging.operation.type"] == "send", outline
    assert process_placement.tags["messaging.operation.type"] == "process", outline
    assert decide.tags["phalanx.attempt"] == state.attempt and decide.tags["phalanx.outcome"] == "placed", outline
    assert node in _as_list(decide.tags["k8s.node.name"]), outline
    assert f"{node}:{','.join(map(str, gpus))}" in _as_list(decide.tags["phalanx.gpus"]), outline
    assert commit.tags["phalanx.outcome"] == "committed", outline

    # One trace, rooted in gang-coordinator, with spans of all three services.
    roots = [s for s in trace.spans if trace.parent(s) is None]
    assert [r.service for r in roots] == [COORD], outline
    assert {s.service for s in trace.spans} >= {COORD, PLACEMENT, BINDER}, outline
    assert all(s.trace_id == trace.trace_id for s in trace.spans)


async def test_a_pod_that_does_not_fit_has_the_reason_on_its_decide_span(stack, jaeger):
    bus, sim = await _session(stack)
    ref = PodRef(namespace="default", name="traced-9gpu")
    try:
        await sim.apply_pod(gpu_pod(ref.name, 9))
        state = await _gang_of(bus, ref, lambda s: s.phase in ("backoff", "waiting") and bool(s.reason))
    finally:
        await bus.close()

    def complete(trace: Trace, decide: Span) -> str | None:
        process = _consumer(trace, trace.parent(decide), PLACEMENT, "placement")
        if process is None:
            return "placement.decide is not the child of placement's process span"
        if _producer(trace.parent(process), COORD, "placement.place") is None:
            return "placement's process span is not the child of gang-coordinator's command"
        if not [s for s in trace.spans if _producer(s, PLACEMENT, "gang.placement_failed")
                and trace.parent(s) == process]:
            return "placement's PlacementFailed publish not (yet) in the trace"
        return None

    trace, decide = await _trace_with(jaeger, PLACEMENT, "placement.decide",
                                      {"phalanx.gang": state.gang_id, "phalanx.outcome": "no_fit"}, complete)
    reason = decide.tags["phalanx.failure_reason"]
    assert reason == "0/2 nodes are available: 2 insufficient free GPUs.", trace.outline()
    # the very reason the pod shows (GangState.reason, events, condition), before its what-if line
    assert state.reason.startswith(reason.removesuffix(".")), state.reason
