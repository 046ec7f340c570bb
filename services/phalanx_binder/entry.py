"""Bind placed pods to their nodes and write the assignment annotation."""

from __future__ import annotations

import anyio

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    pass


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_binder.service import run

    await run(bus, cluster, task_status=task_status)
