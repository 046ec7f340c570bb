"""Forgeries against the running stack, with auth and TLS on: every attacker identity tries
every forgery and the server refuses each one (a "Permissions Violation" for that subject on
the attacker's connection), and nothing Phalanx keeps changes (ledger, gangs, topology, MIG
records, simulated pods, stream sequences).

Attackers: an anonymous client (no credential, and no TLS), a subscriber, the read-only CLI
identity, and the agents of node ``v100-a`` (topology-discovery and mig-manager, with their
real credentials). The victim is a scheduled pod on the 2 x 8-V100 cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from hostile import Forgery, as_identity, attempt  # noqa: E402
from phalanx_bus import Bus, BusAuth, BusError  # noqa: E402
from phalanx_localstack.stack import ClusterFile, Stack  # noqa: E402
from phalanx_proto import events as E  # noqa: E402
from phalanx_proto import subjects as S  # noqa: E402
from phalanx_proto.state import NodeLedger  # noqa: E402
from stackutil import CLUSTER, bound_pods, connect, gang_states, gpu_pod, seed_nodes, wait_until  # noqa: E402

pytestmark = [pytest.mark.hostile, pytest.mark.anyio]

VICTIM = "default/victim"
NODE, OTHER = "v100-a", "v100-b"
ATTACKERS = {  # name -> (identity, nodes)
    "subscriber": (S.SUBSCRIBER, ()),
    "reader": (S.READER, ()),
    "topology-discovery of v100-a": (S.TOPOLOGY_DISCOVERY, (NODE,)),
    "mig-manager of v100-a": (S.MIG_MANAGER, (NODE,)),
}


def _ev(event) -> bytes:
    return E.encoder.encode(event)


def forgeries() -> dict[str, Forgery]:
    ref = E.PodRef(namespace="default", name="victim")
    return {
        "ask binder to bind the victim": Forgery(S.binder_subject(VICTIM), _ev(
            E.BindPods(gang_id=VICTIM, attempt=1, pods=(ref,)))),
        "ask binder to evict the victim": Forgery(S.evict_subject(VICTIM), _ev(
            E.EvictPods(gang_id="default/thief", attempt=1, victims=(VICTIM,)))),
        "tell placement an eviction was refused": Forgery(S.eviction_refused_subject(VICTIM), _ev(
            E.EvictionRefused(gang_id=VICTIM, attempt=1, victims=(VICTIM,)))),
        "release the victim's reservation": Forgery(S.placement_subject(VICTIM), _ev(
            E.ReleaseRequested(gang_id=VICTIM, attempt=1, pods=(ref,)))),
        "request a placement": Forgery(S.placement_subject(VICTIM), _ev(E.PlaceRequested(gang_id=VICTIM, attempt=9))),
        "ask binder to bind the victim, batched": Forgery(S.binder_batch_subject("forger"), _ev(E.batch_of(
            "forger", E.BindPods(gang_id=VICTIM, attempt=1, pods=(ref,))))),
        "request a placement, batched": Forgery(S.placement_batch_subject("forger"), _ev(E.batch_of(
            "forger", E.PlaceRequested(gang_id=VICTIM, attempt=9)))),
        "answer Reserved": Forgery(S.placement_answers_subject("forger"), _ev(E.batch_of(
            "forger", E.Reserved(gang_id=VICTIM, attempt=9)))),
        "answer BindsDone": Forgery(S.binder_answers_subject("forger"), _ev(E.batch_of(
            "forger", E.BindsDone(gang_id=VICTIM, attempt=9, bound=(ref,))))),
        "destroy a MIG instance on its own node": Forgery(S.mig_subject(NODE), _ev(
            E.MigDestroyRequested(node=NODE, gang_id=VICTIM, pod=ref, gpu=0))),
        "destroy a MIG instance on another node": Forgery(S.mig_subject(OTHER), _ev(
            E.MigDestroyRequested(node=OTHER, gang_id=VICTIM, pod=ref, gpu=0))),
        "report MIG ready for another node": Forgery(S.node_reply_subject(OTHER), _ev(
            E.MigReady(node=OTHER, gang_id=VICTIM, pod=ref, instance_uuid="MIG-x"))),
        "schedule a deadline": Forgery(S.deadline_schedule_subject(VICTIM), _ev(E.GangDeadline(gang_id=VICTIM))),
        "write the ledger": Forgery(f"$KV.{S.KV_LEDGER}.{NODE}", msgspec.json.encode(NodeLedger(node=NODE))),
        "write another node's topology": Forgery(f"$KV.{S.KV_TOPOLOGY}.{OTHER}", b"{}"),
        "report a node that does not exist": Forgery(f"$KV.{S.KV_TOPOLOGY}.evil", b"{}"),
        "report another node as cordoned": Forgery(f"$KV.{S.KV_NODE_STATE}.{OTHER}", b'{"unschedulable": true}'),
        "publish a topology event for another node": Forgery(S.topology_subject(OTHER), b"{}"),
        "bind through the simulated API server": Forgery(f"$KV.{S.KV_SIM_PODS}.default.victim", b"{}"),
        "write another node's MIG records": Forgery(f"$KV.{S.KV_MIG}.{OTHER}.0.0", b"{}"),
        "forge a placement decision log": Forgery(S.render(S.CHANNEL["placementDecisions"].template, replica="evil"),
                                                  _ev(E.DecisionsRecorded(replica="evil", base=True))),
        "purge placement's decision log": Forgery(f"$JS.API.STREAM.PURGE.{S.STREAM_DECISIONS}", b"{}"),
        "delete a record of the decision log": Forgery(f"$JS.API.STREAM.MSG.DELETE.{S.STREAM_DECISIONS}",
                                                       b'{"seq": 1}'),
        "purge KV_phx-ledger": Forgery(f"$JS.API.STREAM.PURGE.KV_{S.KV_LEDGER}", b"{}"),
        "delete the gang stream": Forgery(f"$JS.API.STREAM.DELETE.{S.STREAM_GANG}"),
        "create a stream": Forgery("$JS.API.STREAM.CREATE.EVIL", json.dumps(
            {"name": "EVIL", "subjects": ["evil.>"]}).encode()),
        "list streams": Forgery("$JS.API.STREAM.LIST", b"{}"),
        "pull placement's commands": Forgery(f"$JS.API.CONSUMER.MSG.NEXT.{S.STREAM_GANG}.placement", b'{"batch":1}'),
        "create a consumer on another node's MIG commands": Forgery(
            f"$JS.API.CONSUMER.CREATE.{S.STREAM_NODE}.mig-manager-{OTHER}.{S.mig_subject(OTHER)}", b"{}"),
        "create an ephemeral consumer on the ledger": Forgery(f"$JS.API.CONSUMER.CREATE.KV_{S.KV_LEDGER}", b"{}"),
        "read everybody's replies": Forgery("_INBOX.>", subscribe=True),
        "read binder's commands": Forgery("phx.gang.binder.>", subscribe=True),
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The real stack (its own identities per process), with one pod scheduled."""
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path_factory.mktemp("hostile")))
    s.start_nats()

    async def setup() -> None:
        bus, sim = await connect(s)
        try:
            await seed_nodes(s, sim)
            await anyio.to_thread.run_sync(s.start_services)
            await sim.apply_pod(gpu_pod("victim", 2))

            async def scheduled():
                states = await gang_states(bus)
                return VICTIM in await bound_pods(sim) and states.get(VICTIM) and states[VICTIM].phase == "scheduled"

            await wait_until(scheduled, 90)

            async def decision_logged():  # placement sends its log a moment after deciding
                return (await bus.js.stream_info(S.STREAM_DECISIONS)).state.messages > 0

            await wait_until(decision_logged, 30)
        finally:
            await bus.close()

    try:
        anyio.run(setup)
        yield s
    finally:
        s.stop()


def _node_part(value: bytes) -> object:
    """A node state's fields that describe the node, not its pods (the value itself if it does
    not decode: a forged one must show)."""
    try:
        doc = json.loads(value)
    except ValueError:
        return value
    return {k: v for k, v in doc.items() if k not in ("phalanx_pods", "requested", "pods", "host_ports")} \
        if isinstance(doc, dict) else value


async def snapshot(bus: Bus) -> dict:
    """Everything a forgery could change (heartbeats and dead letters excepted; a node's state
    without what follows its pods, which its agent rewrites as they come and go, and without the
    revision, since the agent also writes it again every ``--node-state-reassert-s``)."""
    out: dict = {}
    for bucket in (S.KV_LEDGER, S.KV_GANGS, S.KV_TOPOLOGY, S.KV_NODE_STATE, S.KV_MIG, S.KV_SIM_PODS, S.KV_SIM_NODES):
        out[bucket] = {e.key: _node_part(e.value) if bucket == S.KV_NODE_STATE else (e.revision, e.value)
                       for e in await (await bus.kv(bucket)).items()}
    for stream in (S.STREAM_GANG, S.STREAM_NODE, S.STREAM_DEADLINE, S.STREAM_TOPOLOGY, S.STREAM_DECISIONS):
        out[stream] = (await bus.js.stream_info(stream)).state.last_seq
    out["streams"] = sorted(i.config.name for i in await bus.js.streams_info())
    out["consumers"] = {s: sorted(c.name for c in await bus.js.consumers_info(s))
                        for s in (S.STREAM_GANG, S.STREAM_NODE, f"KV_{S.KV_LEDGER}")}
    return out


@pytest.mark.parametrize("attacker", ATTACKERS)
async def test_every_forgery_is_refused_by_the_server_and_changes_nothing(stack, attacker):
    identity, nodes = ATTACKERS[attacker]
    admin = await Bus.connect(stack.url, service="auditor")
    bus = await as_identity(stack, identity, nodes)
    try:
        before = await snapshot(admin)
        outcomes = {name: await attempt(bus, f) for name, f in forgeries().items()}
        await anyio.sleep(1.0)  # anything a forgery set off would have landed by now
        after = await snapshot(admin)
    finally:
        await bus.close()
        await admin.close()
    assert outcomes == {name: "refused" for name in forgeries()}
    assert after == before


@pytest.mark.parametrize("how", ["no credential", "no TLS"])
async def test_an_anonymous_client_is_refused_at_connect(stack, bus_secrets, how):
    url = stack.url if how == "no credential" else stack.url.replace("tls://", "nats://")
    auth = BusAuth(ca=str(bus_secrets.tls.ca)) if how == "no credential" else BusAuth()
    admin = await Bus.connect(stack.url, service="auditor")
    try:
        before = await snapshot(admin)
        with pytest.raises(BusError, match="refused|cannot connect"):
            await Bus.connect(url, service="anonymous", auth=auth, connect_timeout_s=3)
        assert await snapshot(admin) == before
    finally:
        await admin.close()


ALLOWED = {  # the same probe must see an identity's own rights, or the refusals above prove nothing
    "a subscriber reads gang status": (S.SUBSCRIBER, (), Forgery("phx.gang.status.>", subscribe=True)),
    "a subscriber reads topology events": (S.SUBSCRIBER, (), Forgery("phx.topology.>", subscribe=True)),
    "a node agent beats its own heart": (S.TOPOLOGY_DISCOVERY, (NODE,), Forgery(f"$KV.{S.KV_HEARTBEAT}.{NODE}", b"{}")),
    "the reader reads a node's Kubernetes state": (S.READER, (), Forgery(
        f"$JS.API.DIRECT.GET.KV_{S.KV_NODE_STATE}.$KV.{S.KV_NODE_STATE}.{NODE}")),
    "the reader reads the ledger": (S.READER, (), Forgery(
        f"$JS.API.DIRECT.GET.KV_{S.KV_LEDGER}.$KV.{S.KV_LEDGER}.{NODE}")),
    "mig-manager reads its own node's ledger": (S.MIG_MANAGER, (NODE,), Forgery(
        f"$JS.API.DIRECT.GET.KV_{S.KV_LEDGER}.$KV.{S.KV_LEDGER}.{NODE}")),
}


@pytest.mark.parametrize("case", ALLOWED)
async def test_the_probe_sees_what_an_identity_may_do(stack, case):
    identity, nodes, probe = ALLOWED[case]
    bus = await as_identity(stack, identity, nodes)
    try:
        outcome = await attempt(bus, probe)
    finally:
        await bus.close()
    assert outcome != "refused"


async def test_a_node_agent_speaking_for_another_node_on_its_own_subject_is_dead_lettered(stack):
    """The server lets v100-a's mig-manager publish on its own reply subject; the coordinator's
    consumer refuses an event there that names another node (and nothing changes)."""
    ref = E.PodRef(namespace="default", name="victim")
    admin = await Bus.connect(stack.url, service="auditor")
    bus = await as_identity(stack, S.MIG_MANAGER, (NODE,))
    dlq = S.dead_letter_subject(S.STREAM_NODE, "gang-coordinator-node")
    try:
        before = await snapshot(admin)
        dead_before = (await admin.js.stream_info(S.STREAM_DEAD_LETTER)).state.messages
        await bus.publish(S.node_reply_subject(NODE), E.MigReady(node=OTHER, gang_id=VICTIM, pod=ref,
                                                                   instance_uuid="MIG-forged"))

        async def dead_lettered():
            info = await admin.js.stream_info(S.STREAM_DEAD_LETTER)
            return info.state.messages > dead_before

        await wait_until(dead_lettered, 30)
        msg = await admin.js.get_last_msg(S.STREAM_DEAD_LETTER, dlq)
        after = await snapshot(admin)
    finally:
        await bus.close()
        await admin.close()
    assert "misaddressed: node 'v100-b'" in msg.headers["Phalanx-Error"]
    assert {k: v for k, v in after.items() if k != S.STREAM_NODE} == {
        k: v for k, v in before.items() if k != S.STREAM_NODE}


async def test_a_fleet_credential_speaks_for_exactly_its_listed_nodes(stack):
    """Fleet mode (simulator only): one topology-discovery credential with several node tags."""
    bus = await as_identity(stack, S.TOPOLOGY_DISCOVERY, ("v100-a", "v100-b"))
    try:
        outcomes = {n: await attempt(bus, Forgery(f"$KV.{S.KV_HEARTBEAT}.{n}", b"{}")) for n in ("v100-a", "v100-b", "v100-c")}
    finally:
        await bus.close()
    assert {n: o == "refused" for n, o in outcomes.items()} == {"v100-a": False, "v100-b": False, "v100-c": True}


def _cli(stack: Stack, identity: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **stack.identity_env(identity)}
    return subprocess.run([sys.executable, "-m", "phalanx_cli.main", *args, "--nats", stack.url], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_explain_works_with_the_read_only_identity(stack):
    out = _cli(stack, S.READER, "explain", VICTIM, "--json")
    assert (out.returncode, json.loads(out.stdout)["status"]) == (0, "bound"), out.stderr


def test_events_with_a_subscriber_identity_is_told_which_subjects_it_may_read(stack):
    refused = _cli(stack, S.SUBSCRIBER, "events", "--subject", "phx.gang.binder.>", "--timeout", "3")
    allowed = _cli(stack, S.SUBSCRIBER, "events", "--subject", "phx.gang.status.>", "--timeout", "3")
    assert (refused.returncode, "refused a subscription to phx.gang.binder.>" in refused.stderr) == (2, True), refused
    assert (allowed.returncode, "listening on phx.gang.status.>" in allowed.stderr) == (0, True), allowed
