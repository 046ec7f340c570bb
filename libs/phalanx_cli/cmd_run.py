"""``phalanx run SERVICE``: run one service in this process (what each Deployment/DaemonSet runs).

Services are looked up by name in ``SERVICES`` and imported by module path, so the CLI does
not import service code statically (services stay independent of each other and of the CLI).
Each service package has an ``entry`` module with ``add_arguments(parser)`` and
``async start(args, bus, cluster, *, task_status)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import math
import os
import sys
import traceback
from contextlib import AsyncExitStack

import anyio

from phalanx_kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS, KubeClientSettings
from phalanx_service.shell import serve

SERVICES = {
    "topology-discovery": "phalanx_topology_discovery.entry",
    "gang-coordinator": "phalanx_gang_coordinator.entry",
    "placement": "phalanx_placement.entry",
    "mig-manager": "phalanx_mig_manager.entry",
    "binder": "phalanx_binder.entry",
    "node-fleet": "phalanx_node_fleet.entry",
}
"""``node-fleet`` is the simulator's stand-in for many nodes' agents (``phalanx_node_fleet``,
under ``fleet/``): installed in a checkout's environment, not in the image, where ``phalanx run``
does not offer it."""


def add_nats(p: argparse.ArgumentParser) -> None:
    """``--nats``, ``--nats-creds``, ``--nats-ca``: the one definition every bus-facing command
    shares. Credentials and CA are files, in a pod mounted from Secrets."""
    p.add_argument("--nats", default=os.environ.get("PHALANX_NATS_URL", "nats://127.0.0.1:4222"),
                   help="NATS server URL, or several separated by commas (env PHALANX_NATS_URL; default %(default)s)")
    p.add_argument("--nats-creds", default=os.environ.get("PHALANX_NATS_CREDS"),
                   help="NATS credentials file (user JWT + seed) of this identity (env PHALANX_NATS_CREDS)")
    p.add_argument("--nats-ca", default=os.environ.get("PHALANX_NATS_CA"),
                   help="CA certificate that signed the NATS server's certificate; turns TLS on "
                        "(env PHALANX_NATS_CA)")


def bus_auth(args: argparse.Namespace):
    """The ``BusAuth`` of the ``--nats-creds``/``--nats-ca`` flags (client certificate, if the
    server wants one, from ``PHALANX_NATS_CERT``/``PHALANX_NATS_KEY``)."""
    from phalanx_bus import BusAuth

    env = BusAuth.from_env()
    return BusAuth(args.nats_creds, args.nats_ca, env.cert, env.key)


class BusUnreachable(Exception):
    """NATS did not answer within the command's budget; ``str()`` is the one line to print."""


async def connect_bus(url: str, *, service: str, budget_s: float, quiet: bool = True, auth=None):
    """``Bus.connect`` bounded by ``budget_s`` seconds of wall clock, whatever the client
    library does while it retries (it would otherwise retry an unreachable server forever).
    ``auth`` is the identity and TLS settings (``bus_auth(args)``; ``None``: the environment's).
    Raises ``BusUnreachable`` with one line naming the URL and the budget, or the server's
    refusal of the credential. ``quiet`` (the default, for commands a person runs) keeps the
    bus's retry warnings off the terminal: the command prints its one line instead."""
    from phalanx_bus import Bus, BusError

    if quiet:
        logging.getLogger("phalanx").setLevel(logging.ERROR)
    try:
        with anyio.fail_after(budget_s):
            return await Bus.connect(url, service=service, auth=auth, connect_timeout_s=budget_s)
    except TimeoutError:
        raise BusUnreachable(f"cannot reach NATS at {url} within {budget_s:g}s") from None
    except BusError as e:
        raise BusUnreachable(str(e)) from None


def add_cluster(p: argparse.ArgumentParser) -> None:
    """``--cluster`` and ``--kubeconfig``: which Kubernetes backend (see ``open_cluster``)."""
    p.add_argument("--cluster", choices=("sim", "kube"), default=os.environ.get("PHALANX_CLUSTER", "sim"),
                   help="Kubernetes backend: 'sim' = the simulated cluster in NATS KV, 'kube' = a real API server "
                        "(env PHALANX_CLUSTER; default %(default)s)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file for --cluster kube (default: $KUBECONFIG, else the in-cluster "
                        "ServiceAccount, else ~/.kube/config)")
    p.add_argument("--kube-api-qps", type=_finite, default=DEFAULT_QPS, metavar="QPS",
                   help="--cluster kube: requests per second to the API server on average, as kube-scheduler's "
                        "--kube-api-qps; 0 turns the client-side limit off (default %(default)s)")
    p.add_argument("--kube-api-burst", type=_positive, default=DEFAULT_BURST, metavar="N",
                   help="--cluster kube: requests allowed at once above the average, as kube-scheduler's "
                        "--kube-api-burst; the HTTP connection pool is this plus 8 (default %(default)s)")


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number")
    return value


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of at least 1")
    return int(text)


def add_common(p: argparse.ArgumentParser) -> None:
    add_nats(p)
    add_cluster(p)
    p.add_argument("--health-addr", default=os.environ.get("PHALANX_HEALTH_ADDR", "127.0.0.1:0"),
                   help="host:port for /healthz and /readyz (default %(default)s: a free loopback port)")
    p.add_argument("--ready-file", default=None, help="write PID and health port here once ready")


def register(sub, service: str | None = None) -> None:
    """``run`` with every service's parser, or with ``service``'s alone when it is one (the
    service a command line names: its process imports no other service)."""
    p = sub.add_parser("run", help="run one service (topology-discovery, gang-coordinator, placement, mig-manager, binder)",
                       description="Run one Phalanx service in the foreground until SIGTERM.")
    svc = p.add_subparsers(dest="service", metavar="SERVICE", required=True)
    for name, module in SERVICES.items():
        if service in SERVICES and name != service:
            continue
        if importlib.util.find_spec(module.partition(".")[0]) is None:
            continue  # the simulator's node fleet, absent from the image
        entry = importlib.import_module(module)
        sp = svc.add_parser(name, help=entry.__doc__.strip().splitlines()[0])
        add_common(sp)
        entry.add_arguments(sp)
        sp.set_defaults(func=run_service, entry_module=module)


async def open_cluster(kind: str, bus, *, kubeconfig: str | None = None, stack: AsyncExitStack | None = None,
                       qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST):
    """The ``ClusterPort`` for ``--cluster``: the simulated cluster on ``bus``, or the real API
    server (``kubeconfig``, else ``KUBECONFIG``, else in-cluster) driven at most at ``qps``
    with ``burst``. A real adapter's HTTP session is closed by ``stack``."""
    if kind == "sim":
        from phalanx_kube.kvcluster import KvCluster

        return await KvCluster.open(bus)
    from phalanx_kube.kube import KubeCluster

    try:
        cluster = await KubeCluster.open(kubeconfig, settings=KubeClientSettings(qps=qps, burst=burst))
    except Exception as e:  # noqa: BLE001 - a config problem: say which and stop
        raise SystemExit(f"phalanx: --cluster kube: cannot load a Kubernetes configuration "
                         f"(--kubeconfig, KUBECONFIG or in-cluster): {e}") from e
    if stack is not None:
        stack.push_async_callback(cluster.close)
    return cluster


def find_error(e: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``e`` itself, or the first ``kind`` inside an exception group (a task group wraps
    what its tasks raise), or None."""
    if isinstance(e, kind):
        return e
    if isinstance(e, BaseExceptionGroup):
        return next((f for f in (find_error(x, kind) for x in e.exceptions) if f is not None), None)
    return None


def one_line(e: BaseException) -> str:
    """The message of ``e`` (of the first error inside an exception group) on one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return " ".join(str(e).split()) or type(e).__name__


CONNECT_BUDGET_S = 30.0
"""How long a service waits for NATS at start before it exits non-zero (its restart policy
then decides); once connected the bus reconnects forever."""


def run_service(args: argparse.Namespace) -> int:
    entry = importlib.import_module(args.entry_module)

    async def body(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            bus = await connect_bus(args.nats, service=args.service, budget_s=CONNECT_BUDGET_S, quiet=False,
                                    auth=bus_auth(args))
            stack.push_async_callback(_close, bus)
            cluster = (await open_cluster(args.cluster, bus, kubeconfig=args.kubeconfig, stack=stack,
                                          qps=args.kube_api_qps, burst=args.kube_api_burst)
                       if entry.NEEDS_CLUSTER else None)
            await entry.start(args, bus, cluster, task_status=task_status)

    try:
        return serve(args.service, body, health_addr=args.health_addr, ready_file=args.ready_file)
    except Exception as e:  # noqa: BLE001 - report, exit non-zero
        unreachable = find_error(e, BusUnreachable)
        if unreachable is not None:
            print(f"phalanx run {args.service}: {unreachable}", file=sys.stderr)
            return 1
        traceback.print_exception(e, file=sys.stderr)
        print(f"phalanx run {args.service}: {e}", file=sys.stderr)
        return 1


async def _close(bus) -> None:
    with anyio.move_on_after(2, shield=True):
        await bus.close()
