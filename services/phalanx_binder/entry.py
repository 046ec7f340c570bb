"""Bind placed pods to their nodes, write the assignment annotation and the node's fence."""

from __future__ import annotations

import argparse
import os

import anyio

NEEDS_CLUSTER = True


def _at_least_one(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from 1 to 1024")
    return int(text)


def _namespace(text: str) -> str:
    from phalanx_kubeobjects.names import dns_label

    if not dns_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a DNS label: lower-case letters, digits "
                                         "and '-', at most 63, starting and ending with a letter or digit)")
    return text


def add_arguments(p) -> None:
    p.add_argument("--parallelism", type=_at_least_one, default=os.environ.get("PHALANX_BIND_PARALLELISM", "16"),
                   help="bind commands handled at once, as kube-scheduler binds asynchronously; the Kubernetes "
                        "client's --kube-api-qps/--kube-api-burst still pace the requests (default %(default)s)")
    p.add_argument("--fence-namespace", type=_namespace, default=os.environ.get("POD_NAMESPACE", "phalanx-system"),
                   help="namespace of the per-node fence leases that the node agents' device plugins read "
                        "(default: $POD_NAMESPACE or phalanx-system; docs/delivery.md)")
    p.add_argument("--instance", default="",
                   help="this replica's name, written as the fence leases' holder (default: $POD_NAME, else host "
                        "name and process id)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_binder.service import Settings, run

    await run(bus, cluster, Settings(parallelism=args.parallelism, fence_namespace=args.fence_namespace,
                                     instance=args.instance), task_status=task_status)
