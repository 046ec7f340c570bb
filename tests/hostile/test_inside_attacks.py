"""Attacks from inside the permission table: an attacker holds one legitimate credential (one
node's agent, binder, or gang-coordinator) and uses only what the table allows it. One node's
credential must never stop the cluster, erase or shadow another's records, silence another's
commands or fill the disk; a stolen coordinator credential must never double-book a GPU or
bind a pod where placement did not decide.

The real stack on three simulated nodes (two A100s in MIG mode, one V100), auth and TLS on,
each service with its own credential, the attacker with the real credential of the identity
it plays. Each test is one row of the issue's table (its number in the name).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import msgspec
import nats.errors
import nats.js.errors
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from hostile import Forgery, as_identity, attempt, audited, scrape  # noqa: E402
from phalanx_bus import Bus  # noqa: E402
from phalanx_localstack.stack import OWNER_FILE, WORKDIR_PREFIX, ClusterFile, Stack, remove_stale_workdirs  # noqa: E402
from phalanx_proto import events as E  # noqa: E402
from phalanx_proto import subjects as S  # noqa: E402
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION  # noqa: E402
from phalanx_proto.state import alloc_key  # noqa: E402
from stackutil import connect, gang_states, gpu_pod, ledger, seed_nodes, wait_until  # noqa: E402

pytestmark = [pytest.mark.hostile, pytest.mark.anyio]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "topology"
A, B, C = "a100-a", "a100-b", "v100-c"
NODE_LABEL = "phalanx.io/test-node"


def cluster_file(directory: Path) -> Path:
    a100 = EXAMPLES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt"
    v100 = EXAMPLES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
    nodes = [{"name": n, "labels": {"lj_runtimekit_enable": "true", NODE_LABEL: n}, "topology": str(topo),
              "gpuModel": model, "gpuMemoryMiB": mem, **({"migEnabled": True} if mig else {})}
             for n, topo, model, mem, mig in ((A, a100, "NVIDIA A100-SXM4-40GB", 40960, True),
                                              (B, a100, "NVIDIA A100-SXM4-40GB", 40960, True),
                                              (C, v100, "Tesla V100-SXM2-16GB", 16384, False))]
    path = directory / "cluster.yaml"
    path.write_text(json.dumps({"nodes": nodes}))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("inside")
    s = Stack(ClusterFile.load(cluster_file(d)), workdir=str(d / "stack"),
              service_args={"topology-discovery": ["--node-state-reassert-s", "2"]})
    s.start_nats()

    async def seed() -> None:
        bus, sim = await connect(s)
        try:
            await seed_nodes(s, sim)
        finally:
            await bus.close()

    anyio.run(seed)
    s.start_services()
    yield s
    s.stop()


def pinned(pod: dict, node: str) -> dict:
    pod["spec"]["nodeSelector"] = {NODE_LABEL: node}
    return pod


def mig_pod(name: str, node: str, uid: str = "") -> dict:
    pod = pinned(gpu_pod(name, 1), node)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "4"}
    if uid:
        pod["metadata"]["uid"] = uid
    return pod


async def bound_within(sim, name: str, timeout: float) -> tuple[str, dict]:
    async def bound():
        p = await sim.get_pod(E.PodRef(namespace="default", name=name))
        return p if p is not None and p.node_name else None

    p = await wait_until(bound, timeout, what=f"{name} bound")
    return p.node_name, json.loads(p.annotations[ASSIGNMENT_ANNOTATION])


async def remove(sim, bus, *names: str) -> None:
    for n in names:
        await sim.delete_pod(E.PodRef(namespace="default", name=n))

    async def gone():
        held = {str(a.assignment.pod) for led in (await ledger(bus)).values() for a in led.allocations.values()}
        return not any(f"default/{n}" in held for n in names)

    await wait_until(gone, 45, what="reservations of removed pods released")


def placement_nodes(stack) -> dict[str, float]:
    m = scrape(stack, "placement")
    return {k.split('"')[1]: v for k, v in m.items() if k.startswith("phalanx_placement_nodes{")}


def doctor(stack) -> dict:
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "doctor", "--nats", stack.url, "--json"],
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def topology_report(node: str, **edit) -> E.NodeTopologyReported:
    from phalanx_topology_discovery.service import topology_from_file

    topo = topology_from_file(str(EXAMPLES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt"), node,
                              gpu_model="NVIDIA A100-SXM4-40GB", gpu_memory_mib=40960, mig_enabled=True)
    return E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(topo, **edit))


def broken_reports(node: str) -> dict[str, bytes]:
    """Row 1 and row 6: what one node's agent wrote under its own key on main at a0777e4."""
    good = topology_report(node).topology
    links = {a: {b: r for b, r in row.items() if {a, b} != {"GPU0", "GPU1"}} for a, row in good.relations.items()}
    twins = (*good.gpus[:7], msgspec.structs.replace(good.gpus[7], name="GPU0"))
    huge_index = (msgspec.structs.replace(good.gpus[0], index=10**18), *good.gpus[1:])
    long_model = (msgspec.structs.replace(good.gpus[0], model="m" * 400_000), *good.gpus[1:])
    many_nics = tuple(msgspec.structs.replace(good.nics[0], name=f"mlx5_{i}") for i in range(3000))
    enc = E.encoder.encode
    return {
        "GPU links missing": enc(E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(good, relations=links))),
        "two GPUs with one name": enc(E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(good, gpus=twins))),
        "GPU index 10^18": enc(E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(good, gpus=huge_index))),
        "3,000 NICs": enc(E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(good, nics=many_nics))),
        "a 400 KB string": enc(E.NodeTopologyReported(node=node, topology=msgspec.structs.replace(good, gpus=long_model))),
    }


async def put_as(bus: Bus, bucket: str, key: str, value: bytes, headers: dict | None = None) -> str:
    """Publish a KV value as the attacker does (its own key); ``stored`` or the server's refusal."""
    try:
        await bus.js.publish(f"$KV.{bucket}.{key}", value, headers=headers, timeout=5)
        return "stored"
    except (nats.js.errors.APIError, nats.errors.Error) as e:
        return f"refused: {e}"


# --- rows 1, 5, 6: a node's own records are data, not code's precondition ---------------------

async def test_rows_1_5_6_a_node_writing_broken_records_of_its_own_is_isolated_and_placement_keeps_placing(stack):
    bus, sim = await connect(stack)
    await anyio.to_thread.run_sync(stack.kill, f"topology-discovery@{A}")  # so nothing rewrites its key
    attacker = await as_identity(stack, S.TOPOLOGY_DISCOVERY, (A,))
    outcomes: dict[str, str] = {}
    try:
        async with audited(bus):
            for k, (case, raw) in enumerate(broken_reports(A).items()):
                outcomes[case] = await put_as(attacker, S.KV_TOPOLOGY, S.token(A), raw)
                name = f"after-report-{k}"
                await sim.apply_pod(gpu_pod(name, 1))
                node, a = await bound_within(sim, name, 45)
                assert node == C and all(g < 8 for g in a["gpus"]), (case, node, a)
                assert stack.procs["placement"].proc.poll() is None, f"placement exited after {case}"
            # Row 5: beats from 10^9 s ahead, as often as the attacker likes.
            for _ in range(300):
                await attacker.js.publish(f"$KV.{S.KV_HEARTBEAT}.{S.token(A)}", E.encoder.encode(
                    E.NodeHeartbeat(node=A, at=time.time() + 1e9)))
            counts = await wait_until(lambda: _invalid(stack, 1), 20, what="a100-a counted invalid")
            assert counts["invalid"] == 1
            doc = await anyio.to_thread.run_sync(doctor, stack)
            bad = {b: [(x["key"], x["error"]) for x in v.get("bad", [])] for b, v in doc["kv"].items()}
            assert [k for k, _ in bad[S.KV_HEARTBEAT]] == [S.token(A)]
            assert "a beat is at most 60 s ahead (clock skew)" in bad[S.KV_HEARTBEAT][0][1]
            assert [k for k, _ in bad[S.KV_TOPOLOGY]] == [S.token(A)]
        assert outcomes["GPU links missing"] == outcomes["two GPUs with one name"] == "stored"
        assert outcomes["a 400 KB string"].startswith("refused") and "maximum" in outcomes["a 400 KB string"]
        # Its agent back: the node is whole again.
        await anyio.to_thread.run_sync(stack.restart, f"topology-discovery@{A}")
        await wait_until(lambda: _invalid(stack, 0, fresh=3), 30, what="a100-a valid again")
    finally:
        await attacker.close()
        await remove(sim, bus, *(f"after-report-{k}" for k in range(5)))
        await bus.close()


async def _invalid(stack, n: int, fresh: int | None = None) -> dict | None:
    counts = await anyio.to_thread.run_sync(placement_nodes, stack)
    ok = counts.get("invalid") == n and (fresh is None or counts.get("fresh") == fresh)
    return counts if ok else None


# --- row 2: no identity can erase another's records ------------------------------------------

async def test_row_2_a_rollup_header_erases_nothing_and_a_lost_record_is_written_again(stack):
    bus, sim = await connect(stack)
    agent = await as_identity(stack, S.TOPOLOGY_DISCOVERY, (A,))
    mig = await as_identity(stack, S.MIG_MANAGER, (A,))
    state_kv = await bus.kv(S.KV_NODE_STATE)
    try:
        before = {e.key: e.revision for e in await state_kv.items()}
        assert set(before) == {S.token(n) for n in (A, B, C)}
        own = (await state_kv.get(S.token(A))).value
        rolled = await put_as(agent, S.KV_NODE_STATE, S.token(A), own, {"Nats-Rollup": "all"})
        rolled_mig = await put_as(mig, S.KV_MIG, S.token(A), E.encoder.encode({"node": A}), {"Nats-Rollup": "all"})
        assert rolled.startswith("refused") and "rollup not permitted" in rolled
        assert rolled_mig.startswith("refused") and "rollup not permitted" in rolled_mig
        assert {e.key: e.revision for e in await state_kv.items()} == before
        # A record lost anyway (say, with a server's disk) is written again by its own agent.
        await state_kv.delete(S.token(C))

        async def back():
            return await state_kv.get(S.token(C))

        await wait_until(back, 20, what="v100-c's node state written again")
    finally:
        await agent.close()
        await mig.close()
        await bus.close()


# --- row 3: nobody can pre-empt another's message ids -----------------------------------------

async def test_row_3_junk_under_the_ids_of_another_nodes_commands_drops_nothing(stack):
    """The ids an attacker can compute are the plain idempotency keys; the messages Phalanx
    publishes carry them signed with their publisher's key, so the junk drops nothing."""
    bus, sim = await connect(stack)
    node_agent = await as_identity(stack, S.MIG_MANAGER, (A,))
    binder = await as_identity(stack, S.BINDER)
    uid = str(uuid.uuid4())
    gang = "default/mig-victim"
    ref = E.PodRef(namespace="default", name="mig-victim", uid=uid)
    try:
        ids = {
            "placement request": (binder, S.binder_answers_subject("x"), E.PlaceRequested(
                gang_id=gang, attempt=1, members_digest=E.uid_digest([ref])).key()),
            "MIG prepare for a100-b": (node_agent, S.node_reply_subject(A), E.MigPrepareRequested(
                node=B, gang_id=gang, attempt=1, pod=ref).key()),
            "bind": (binder, S.binder_answers_subject("x"), E.BindPods(gang_id=gang, attempt=1, pods=(ref,)).key()),
        }
        for who, subject, msg_id in ids.values():
            await who.js.publish(subject, b"junk", headers={"Nats-Msg-Id": msg_id})
        await sim.apply_pod(mig_pod("mig-victim", B, uid))
        node, a = await bound_within(sim, "mig-victim", 60)
        assert (node, a["mig_profile"]) == (B, "3g.20gb")
        assert (await gang_states(bus))[gang].attempt == 1  # no attempt was lost to a dropped command
    finally:
        await node_agent.close()
        await binder.close()
        await remove(sim, bus, "mig-victim")
        await bus.close()


async def test_row_3_junk_under_the_id_of_the_next_dead_letter_does_not_drop_it(stack):
    bus, _ = await connect(stack)
    node_agent = await as_identity(stack, S.MIG_MANAGER, (A,))
    dlq = S.dead_letter_subject(S.STREAM_NODE, "gang-coordinator-node")
    try:
        seq = (await bus.js.stream_info(S.STREAM_NODE)).state.last_seq + 1
        own_dlq = S.dead_letter_subject(S.STREAM_NODE, f"mig-manager-{A}")
        for n in range(seq, seq + 3):  # the forged reply below is one of the next few
            await node_agent.js.publish(own_dlq, b"junk", headers={"Nats-Msg-Id": f"dlq:{S.STREAM_NODE}:"
                                                                                 f"gang-coordinator-node:{n}"})
        await node_agent.publish(S.node_reply_subject(A), E.MigReady(node=B, gang_id="default/x", pod=E.PodRef(
            namespace="default", name="x"), instance_uuid="MIG-forged"))

        async def recorded():
            try:
                msg = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, dlq)
            except nats.js.errors.NotFoundError:
                return None
            return msg if "MIG-forged" in msg.data.decode() else None

        msg = await wait_until(recorded, 30, what="the forgery dead-lettered")
        assert "misaddressed: node 'a100-b'" in msg.headers["Phalanx-Error"]
    finally:
        await node_agent.close()
        await bus.close()


# --- row 4: one node's flood is bounded and holds nobody else up ------------------------------

async def test_row_4_a_nodes_flood_is_bounded_and_another_nodes_mig_pod_binds_meanwhile(stack):
    bus, sim = await connect(stack)
    node_agent = await as_identity(stack, S.MIG_MANAGER, (A,))
    reply, own_dlq = S.node_reply_subject(A), S.dead_letter_subject(S.STREAM_NODE, f"mig-manager-{A}")
    node_stream = next(s for s in S.STREAMS if s.name == S.STREAM_NODE)
    dlq_stream = next(s for s in S.STREAMS if s.name == S.STREAM_DEAD_LETTER)
    sent = {"replies": 0, "dead letters": 0}
    try:
        with pytest.raises(nats.js.errors.APIError, match="maximum"):
            await node_agent.js.publish(reply, b"x" * (32 * 1024), timeout=5)
        chunk = b"x" * (S.NODE_MESSAGE_MAX - 512)
        flooding = True

        async def flood(subject: str, what: str) -> None:
            while flooding:
                await node_agent.nc.publish(subject, chunk)
                sent[what] += 1
                if sent[what] % 200 == 0:
                    await node_agent.nc.flush()

        async with anyio.create_task_group() as tg:
            tg.start_soon(flood, reply, "replies")
            tg.start_soon(flood, own_dlq, "dead letters")
            await anyio.sleep(2.0)
            started = time.monotonic()
            await sim.apply_pod(mig_pod("beside-flood", B))
            node, _ = await bound_within(sim, "beside-flood", 60)
            took = time.monotonic() - started
            flooding = False
            tg.cancel_scope.cancel()
        info = await bus.js.stream_info(S.STREAM_NODE, subjects_filter=reply)
        dead = await bus.js.stream_info(S.STREAM_DEAD_LETTER, subjects_filter=own_dlq)
        print(f"flood: {sent}; {A}'s replies kept {info.state.subjects}, bytes {info.state.bytes}; "
              f"its dead letters kept {dead.state.subjects}; a100-b's MIG pod bound in {took:.1f}s")
        assert node == B
        assert sent["replies"] > node_stream.max_msgs_per_subject and sent["dead letters"] > dlq_stream.max_msgs_per_subject
        assert info.state.subjects[reply] <= node_stream.max_msgs_per_subject
        assert dead.state.subjects[own_dlq] <= dlq_stream.max_msgs_per_subject
        assert info.state.bytes <= node_stream.max_bytes
        # The bound: a100-b's reply waits behind at most max_msgs_per_subject of a100-a's (1,024
        # junk messages the coordinator terminates in well under a second), not behind the flood.
        assert took < 30, took
    finally:
        await node_agent.close()
        await remove(sim, bus, "beside-flood")
        await bus.close()


# --- rows 7, 8: a stolen coordinator credential ------------------------------------------------

async def test_row_7_erasing_a_gangs_record_and_releasing_it_never_frees_a_running_pods_gpus(stack):
    bus, sim = await connect(stack)
    coordinator = await as_identity(stack, S.GANG_COORDINATOR)
    try:
        async with audited(bus):
            await sim.apply_pod(pinned(gpu_pod("victim-7", 8), C))
            await bound_within(sim, "victim-7", 45)
            victim = (await gang_states(bus))["default/victim-7"]
            ref = victim.members[0].pod

            async def listed():
                state = await (await bus.kv(S.KV_NODE_STATE)).get(S.token(C))
                return state is not None and alloc_key(ref) in msgspec.json.decode(state.value).get("phalanx_pods", ())

            await wait_until(listed, 20, what="v100-c's agent reports the victim running there")
            await (await coordinator.kv(S.KV_GANGS)).delete(S.gang_key("default/victim-7"))
            await coordinator.publish(S.placement_subject("default/victim-7"), E.ReleaseRequested(
                gang_id="default/victim-7", attempt=victim.attempt, reason="stolen credential", pods=(ref,)),
                msg_id=f"forged-{uuid.uuid4().hex}")
            await sim.apply_pod(pinned(gpu_pod("thief-7", 8), C))
            for _ in range(20):  # ten seconds: the release is retried, and refused, all along
                held = (await ledger(bus))[C].allocations
                assert alloc_key(ref) in held, "the victim's reservation was freed under it"
                assert not any(a.assignment.pod.name == "thief-7" for a in held.values())
                await anyio.sleep(0.5)
        refusals = await anyio.to_thread.run_sync(scrape, stack, "placement")
        assert refusals.get('phalanx_refused_messages_total{rule="live_pod"}', 0) >= 1
    finally:
        await coordinator.close()
        await remove(sim, bus, "thief-7", "victim-7")
        await bus.close()


async def test_row_8_an_adoption_and_a_bind_for_a_pending_pod_bind_nothing(stack):
    bus, sim = await connect(stack)
    coordinator = await as_identity(stack, S.GANG_COORDINATOR)
    try:
        pod = await sim.apply_pod(pinned(gpu_pod("stuck-8", 1), "no-such-node"))
        gang = "default/stuck-8"
        a = E.Assignment(pod=pod.ref, node=A, gpus=(0,))
        await coordinator.publish(S.placement_subject(gang), E.AdoptRequested(gang_id=gang, attempt=1, assignment=a,
                                                                              reason="stolen credential"),
                                  msg_id=f"forged-{uuid.uuid4().hex}")
        await anyio.sleep(3)
        await coordinator.publish(S.binder_subject(gang), E.BindPods(gang_id=gang, attempt=1, pods=(pod.ref,)),
                                  msg_id=f"forged-{uuid.uuid4().hex}")
        await anyio.sleep(3)
        assert (await sim.get_pod(pod.ref)).node_name == ""
        assert not any(k == alloc_key(pod.ref) for led in (await ledger(bus)).values() for k in led.allocations)
        m = await anyio.to_thread.run_sync(scrape, stack, "placement")
        assert m.get('phalanx_refused_messages_total{rule="not_running_there"}', 0) >= 1
    finally:
        await coordinator.close()
        await remove(sim, bus, "stuck-8")
        await bus.close()


async def test_row_11_a_forged_eviction_without_a_nomination_evicts_nothing(stack):
    """A stolen placement credential (the only publisher of evictions) names a running gang as a
    victim of a preemption the ledger holds no nomination for: binder evicts nothing."""
    bus, sim = await connect(stack)
    thief = await as_identity(stack, S.PLACEMENT)
    try:
        await sim.apply_pod(pinned(gpu_pod("victim-11", 8), C))
        node, _ = await bound_within(sim, "victim-11", 45)
        victim = "default/victim-11"
        assert victim in await gang_states(bus)
        for forged in (E.EvictPods(gang_id="default/thief-11", attempt=1, victims=(victim,)),
                       E.EvictPods(gang_id=victim, attempt=1, victims=(victim,))):
            await thief.publish(S.evict_subject(forged.gang_id), forged, msg_id=f"forged-{uuid.uuid4().hex}")
        await anyio.sleep(3)
        pod = await sim.get_pod(E.PodRef(namespace="default", name="victim-11"))
        assert pod is not None and pod.node_name == node and not pod.deleting
        assert not [e for e in await sim.list_events(pod.ref) if e.reason == "Preempted"]
        assert (await gang_states(bus))[victim].phase == "scheduled"
        m = await anyio.to_thread.run_sync(scrape, stack, "binder")
        assert m.get('phalanx_refused_messages_total{rule="not_recorded"}', 0) >= 2
        assert m.get('phalanx_evictions_total{result="evicted"}', 0) == 0
    finally:
        await thief.close()
        await remove(sim, bus, "victim-11")
        await bus.close()


# --- row 9: no node agent creates a consumer --------------------------------------------------

async def test_row_9_a_new_nodes_agent_cannot_create_a_push_consumer_even_on_its_own_commands(stack):
    node = "new-node"
    agent = await as_identity(stack, S.MIG_MANAGER, (node,))
    durable = f"mig-manager-{node}"
    body = json.dumps({"stream_name": S.STREAM_NODE, "config": {
        "durable_name": durable, "name": durable, "deliver_subject": "phx.gang.binder.default.victim",
        "filter_subject": S.mig_subject(node), "ack_policy": "explicit"}}).encode()
    try:
        outcome = await attempt(agent, Forgery(
            f"$JS.API.CONSUMER.CREATE.{S.STREAM_NODE}.{durable}.{S.mig_subject(node)}", body))
        pull = await attempt(agent, Forgery(f"$JS.API.CONSUMER.CREATE.{S.STREAM_NODE}.{durable}.{S.mig_subject(node)}",
                                            json.dumps({"stream_name": S.STREAM_NODE, "config": {
                                                "durable_name": durable, "name": durable,
                                                "filter_subject": S.mig_subject(node)}}).encode()))
    finally:
        await agent.close()
    assert (outcome, pull) == ("refused", "refused")


# --- row 10: no seed on disk -------------------------------------------------------------------

SEED = re.compile(rb"\bS[OA][A-Z2-7]{50,}")
"""An operator (SO…) or account (SA…) NKey seed; user seeds (SU…) are what credentials hold."""


def test_row_10_phalanx_up_keeps_no_operator_or_account_seed_on_disk_and_a_killed_ones_dir_goes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHALANX_BUS_SECRETS", "PHALANX_NATS_"))}
    env["TMPDIR"] = str(tmp_path)
    up = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "up"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        for line in up.stdout:
            if "ready" in line.lower() or time.monotonic() > deadline:
                break
        (workdir,) = tmp_path.glob(f"{WORKDIR_PREFIX}*")
        files = [p for p in workdir.rglob("*") if p.is_file()]
        assert any(p.suffix == ".creds" for p in files), "the stack's credentials should be there"
        assert not any(p.name == "keys.json" for p in files)
        assert [p for p in files if p.suffix != ".log" and SEED.search(p.read_bytes())] == []
    finally:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(10)
    time.sleep(1)  # the children die with their parent (PDEATHSIG)
    assert (workdir / OWNER_FILE).exists()
    assert remove_stale_workdirs(str(tmp_path)) == [workdir]  # what the next `phalanx up` does first
    assert not workdir.exists()
