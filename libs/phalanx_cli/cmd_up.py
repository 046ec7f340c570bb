"""``phalanx up`` and ``phalanx demo``: the whole scheduler on one machine.

Both start a nats-server (or use ``--nats URL``), every service as its own process, and the
simulated cluster from a cluster file. ``up`` applies an optional workload and runs until
Ctrl-C, printing decisions as they happen; ``demo`` runs the bundled 2 × 8-V100 cluster with a
small workload, waits until every pod is scheduled or pending with a reason, prints a table
(or ``--json``) and exits 0. A cluster or workload file that cannot be read exits 2; one that
was read but is invalid (the field path is named) exits 1; nothing is started for either.

SIGTERM (what systemd, ``timeout`` and CI send) stops ``up`` as Ctrl-C does: every service,
then the nats-server, then the temp dir is removed; a second signal during that shutdown is
ignored. Once the event loop runs, a signal is a message to it (``_until_signalled`` cancels the
run), never an exception raised wherever the main thread happens to be: one raised inside the
NATS client's reconnect task could leave the loop unable to finish. No child outlives ``up``: each runs in its own process group and, on Linux, gets
SIGTERM if ``up`` itself is killed (``phalanx_localstack.children``). When the embedded
nats-server dies, ``up`` says so and starts it again on the same port and store; the services
reconnect to it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from phalanx_cli.cmd_run import CONNECT_BUDGET_S, BusUnreachable, connect_bus
from phalanx_cli.terminal import safe
from phalanx_input import Invalid
from phalanx_localstack.inputs import load_queues
from phalanx_localstack.stack import ClusterFile, Stack, StackError, load_workload
from phalanx_localstack.synthetic import synthetic_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_CLUSTER = EXAMPLES / "clusters" / "2x8v100.yaml"
DEMO_WORKLOAD = EXAMPLES / "workloads" / "demo.yaml"


def register(sub) -> None:
    up = sub.add_parser("up", help="run NATS, all five services and a simulated cluster until Ctrl-C",
                        description="Run the whole scheduler locally: an embedded nats-server (unless --nats), "
                                    "every service as its own process, and a simulated cluster.")
    nodes = up.add_mutually_exclusive_group()
    nodes.add_argument("--cluster-file", default=str(DEMO_CLUSTER), help="nodes to simulate (default: %(default)s)")
    nodes.add_argument("--synthetic", metavar="NxSHAPE",
                       help="simulate N identical nodes with network tiers instead, e.g. 1000x8v100 (shapes: "
                            "8v100, 8a100, 8a100mig, 8h100); above 16 nodes one node-fleet process serves them")
    up.add_argument("--workload", help="pods to submit once the services are ready (multi-document YAML)")
    up.add_argument("--queues", help="Queue and Namespace objects to create first (docs/queues.md; multi-document "
                                     "YAML, checked as `phalanx validate` does)")
    up.add_argument("--nats", help="use this NATS server instead of starting one")
    up.set_defaults(func=lambda a: _run(a, demo=False))

    demo = sub.add_parser("demo", help="schedule a sample workload on 2 x 8-V100 nodes, print the result, exit",
                          description="Start everything as 'up' does, submit the demo workload, wait until every "
                                      "pod is scheduled or pending with a reason, print a table and exit.")
    demo.add_argument("--json", action="store_true", help='print one JSON document {"pods": [...]} instead of a table')
    demo.add_argument("--cluster-file", default=str(DEMO_CLUSTER), help="default: %(default)s")
    demo.add_argument("--workload", default=str(DEMO_WORKLOAD), help="default: %(default)s")
    demo.add_argument("--nats", help="use this NATS server instead of starting one")
    demo.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for decisions (default %(default)s)")
    demo.set_defaults(func=lambda a: _run(a, demo=True))


def _progress(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, *, demo: bool) -> int:
    try:
        cluster = (synthetic_cluster(args.synthetic) if getattr(args, "synthetic", None)
                   else ClusterFile.load(args.cluster_file))
        pods = load_workload(args.workload) if args.workload else []
        queues = load_queues(args.queues) if getattr(args, "queues", None) else ([], [])
    except OSError as e:  # phalanx_input.Unreadable included
        print(safe(f"phalanx: cannot read: {e.strerror or e}"), file=sys.stderr)
        return 2
    except Invalid as e:
        print(safe(f"phalanx: {e}"), file=sys.stderr)
        return 1
    except StackError as e:  # a bad --synthetic spec
        print(safe(f"phalanx: {e}"), file=sys.stderr)
        return 2
    stack = Stack(cluster, nats_url=args.nats)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return anyio.run(_drive, stack, pods, args, demo, queues)
    except StackError as e:
        print(f"phalanx: {e}", file=sys.stderr)
        return 1
    except BusUnreachable as e:
        print(f"phalanx: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            took = stack.stop()
            if not demo and took:
                print(f"stopped {len(took)} services in {max(took.values()):.1f}s", file=sys.stderr)
        finally:
            for s, handler in handlers.items():
                signal.signal(s, previous if s == signal.SIGTERM else handler)


async def _apply_queues(bus, sim, queues, namespaces) -> None:
    """Create the Queues and Namespaces, and wait (10 s at most) until gang-coordinator has
    read every Queue, so the workload's pods find them."""
    from phalanx_proto import subjects as S
    from phalanx_proto.queues import queue_key

    for name, labels in namespaces:
        await sim.apply_namespace(name, labels)
    for q in queues:
        await sim.apply_queue(q)
    kv = await bus.kv(S.KV_QUEUES)
    wanted = {queue_key(q["metadata"]["name"]) for q in queues}
    with anyio.move_on_after(10):
        while not wanted <= set(await kv.keys()):
            await anyio.sleep(0.2)
    await anyio.sleep(2.5)  # and its namespaces (read on the same period)


def _interrupt(signum: int, frame: object) -> None:
    """Before the event loop runs (and after it), SIGTERM does what Ctrl-C does."""
    raise KeyboardInterrupt


async def _drive(stack: Stack, pods: list[dict[str, Any]], args, demo: bool, queues=([], [])) -> int:
    """Run the stack until done or until SIGINT/SIGTERM; a signal cancels the run (0 either way).
    The receiver stays open until the run has unwound, so a second signal meanwhile is ignored."""
    code = 0
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_signalled, signals, tg.cancel_scope)
            code = await _serve(stack, pods, args, demo, queues)
            tg.cancel_scope.cancel()
    return code


async def _until_signalled(signals, scope: anyio.CancelScope) -> None:
    async for _signum in signals:
        scope.cancel()
        return


async def _serve(stack: Stack, pods: list[dict[str, Any]], args, demo: bool, queues) -> int:
    from phalanx_bus import BusAuth
    from phalanx_kube.kvcluster import KvCluster
    from phalanx_proto import subjects as S

    quiet = demo and args.json
    started = time.monotonic()
    stack.start_nats()
    _progress(quiet, f"nats: {stack.url}")
    await anyio.to_thread.run_sync(stack.bootstrap, abandon_on_cancel=True)
    admin = stack.identity_env(S.ADMIN)
    if admin:
        reader = stack.identity_env(S.READER)
        _progress(quiet, f"read-only identity (explain, events, doctor): export PHALANX_NATS_URL={stack.url} "
                         f"PHALANX_NATS_CA={reader['PHALANX_NATS_CA']} PHALANX_NATS_CREDS={reader['PHALANX_NATS_CREDS']}")
    bus = await connect_bus(stack.url, service="cli", budget_s=CONNECT_BUDGET_S, quiet=False,
                            auth=BusAuth.from_env(admin or None))
    try:
        sim = await KvCluster.open(bus)
        for node in stack.cluster.node_objects():
            await sim.apply_node(node)
        _progress(quiet, f"starting {len(stack.plan())} service processes for {len(stack.cluster.nodes)} nodes ...")
        stack.spawn_services()  # from the main thread, so the children die with this process
        await anyio.to_thread.run_sync(stack.wait_ready, list(stack.procs), stack.ready_timeout_s,
                                       abandon_on_cancel=True)
        topo_kv = await bus.kv(S.KV_TOPOLOGY)
        with anyio.fail_after(30 + 0.01 * len(stack.cluster.nodes)):
            while len(await topo_kv.keys()) < len(stack.cluster.nodes):
                await anyio.sleep(0.2)
        names = [n.name for n in stack.cluster.nodes]
        _progress(quiet, f"ready in {time.monotonic() - started:.1f}s: " + (
            ", ".join(names) if len(names) <= 16 else f"{len(names)} nodes ({names[0]} … {names[-1]})"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(_print_decisions, bus, quiet)
            tg.start_soon(_supervise_nats, stack)
            if queues[0] or queues[1]:
                await _apply_queues(bus, sim, *queues)
                _progress(quiet, f"created {len(queues[0])} queues and {len(queues[1])} namespaces")
            for pod in pods:
                await sim.apply_pod(pod)
            if pods:
                _progress(quiet, f"submitted {len(pods)} pods")
            if not demo:
                await anyio.sleep_forever()
            rows = await _wait_decided(bus, sim, pods, args.timeout)
            tg.cancel_scope.cancel()
        if args.json:
            print(json.dumps({"pods": rows}, indent=2))
        else:
            print(_table(rows))
        return 0
    finally:
        with anyio.move_on_after(3, shield=True):
            await bus.close()


async def _supervise_nats(stack: Stack, period_s: float = 0.5) -> None:
    """Restart the embedded nats-server on its own port and store whenever it dies, and say so.
    The restart runs on the main thread, so the new server also dies with this process."""
    while True:
        await anyio.sleep(period_s)
        code = stack.nats_exit_code()
        if code is None:
            continue
        print(f"{time.strftime('%H:%M:%S')} nats-server exited with code {code}; restarting it on the same "
              f"store ({stack.url})", file=sys.stderr, flush=True)
        try:
            stack.restart_nats()
        except Exception as e:  # noqa: BLE001 - say why, try again next period
            print(f"{time.strftime('%H:%M:%S')} nats-server did not restart: {e}", file=sys.stderr, flush=True)
            continue
        print(f"{time.strftime('%H:%M:%S')} nats-server restarted; services reconnect to it", file=sys.stderr,
              flush=True)


async def _print_decisions(bus, quiet: bool) -> None:
    from phalanx_bus import DecodeFailure, tail
    from phalanx_proto.events import GangPending, GangScheduled, RollbackStarted, gang_decoder

    async for _subject, ev in tail(bus, "phx.gang.status.>", gang_decoder):
        if quiet or isinstance(ev, DecodeFailure):
            continue
        stamp = time.strftime("%H:%M:%S")
        match ev:
            case GangScheduled():
                for a in ev.assignments:
                    print(safe(f"{stamp} scheduled {a.pod} -> {a.node} GPUs {list(a.gpus)} (gang {ev.gang_id}, "
                               f"attempt {ev.attempt})"), file=sys.stderr, flush=True)
            case GangPending():
                print(safe(f"{stamp} pending   {ev.gang_id}: {ev.reason}"), file=sys.stderr, flush=True)
            case RollbackStarted():
                print(safe(f"{stamp} rollback  {ev.gang_id} attempt {ev.attempt}: {ev.reason}"), file=sys.stderr,
                      flush=True)


async def _wait_decided(bus, sim, pods: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Poll until every submitted pod is bound, or its gang waits with a reason."""
    from phalanx_proto import subjects as S
    from phalanx_proto.events import PodRef
    from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
    from phalanx_proto.state import gang_state_decoder
    from phalanx_proto.vocab import IDLE

    gangs_kv = await bus.kv(S.KV_GANGS)
    deadline = time.monotonic() + timeout
    while True:
        states = [gang_state_decoder.decode(e.value) for e in await gangs_kv.items()]
        rows = []
        for obj in pods:
            meta = obj["metadata"]
            ref = PodRef(namespace=meta.get("namespace") or "default", name=meta["name"])
            pod = await sim.get_pod(ref)
            row = {"namespace": ref.namespace, "name": ref.name, "status": "pending", "node": None, "gpus": [],
                   "reason": ""}
            if pod is not None and pod.node_name:
                assignment = json.loads(pod.annotations.get(ASSIGNMENT_ANNOTATION, "{}"))
                row.update(status="scheduled", node=pod.node_name, gpus=list(assignment.get("gpus", [])))
            elif pod is not None:
                state = next((s for s in states if any(m.pod.name == ref.name and m.pod.namespace == ref.namespace
                                                       for m in s.members)), None)
                cond = next((c for c in (pod.raw.get("status") or {}).get("conditions", [])
                             if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
                if state is not None and state.phase in IDLE and state.reason:
                    row["reason"] = f"{state.reason} (attempt {state.attempt})"
                elif cond is not None:
                    row["reason"] = cond.get("message", "")
            rows.append(row)
        if all(r["status"] == "scheduled" or r["reason"] for r in rows):
            return rows
        if time.monotonic() > deadline:
            for r in rows:
                if r["status"] == "pending" and not r["reason"]:
                    r["reason"] = f"no decision within {timeout:.0f}s"
            return rows
        await anyio.sleep(0.2)


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ["NAMESPACE", "POD", "STATUS", "NODE", "GPUS", "REASON"]
    body = [[r["namespace"], r["name"], r["status"], r["node"] or "-", ",".join(map(str, r["gpus"])) or "-",
             r["reason"] or "-"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)] if body else [len(h) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip() for b in body]
    return "\n".join(lines)

