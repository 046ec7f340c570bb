"""CLI flags of mig-manager: ``phalanx run mig-manager --node N [--nvml fake:<model>x<count>]``.

``--nvml real`` (the default) drives the GPUs through the NVIDIA driver. ``--nvml fake:...``
is for tests and the simulator only: an in-memory fake NVML that enforces the MIG rules of
``phalanx_engine.mig.TABLES`` (for example ``fake:H100-80GBx2`` or
``fake:A100-40GBx1,A100-40GBx1@off`` for a second GPU with MIG mode off). It must never run on
a real node: it creates nothing on any GPU.
"""

from __future__ import annotations

import os

import anyio

NEEDS_CLUSTER = False


def add_arguments(p) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), required=not os.environ.get("NODE_NAME"),
                   help="this node's name (env NODE_NAME)")
    p.add_argument("--nvml", default=os.environ.get("PHALANX_MIG_NVML", "real"),
                   help="'real' (the driver), or 'fake:<model>x<count>[@off][,...]' (tests/simulator only)")
    p.add_argument("--reconcile-s", type=float, default=30.0, help="seconds between reconciliation passes")
    p.add_argument("--orphan-grace-s", type=float, default=60.0,
                   help="an instance owned by nothing is destroyed after this many seconds")


def devices_from(spec: str, node: str = ""):
    """The ``MigDevices`` for a ``--nvml`` value (a fake stands for ``node``); raises ValueError
    for a bad one."""
    from phalanx_nvml import NvmlMig

    if spec == "real":
        return NvmlMig()
    if spec.startswith("fake:"):
        try:  # the simulator's (sim/): in a checkout's environment, never in the image
            from phalanx_nvmlfake.mig import from_spec
        except ModuleNotFoundError:
            raise ValueError("--nvml fake:... is the simulator's fake NVML, which this installation does not "
                             "have (run the simulator from a checkout: make install)") from None
        return NvmlMig(from_spec(spec.removeprefix("fake:"), node=node))
    raise ValueError(f"--nvml must be 'real' or 'fake:<model>x<count>', not {spec!r}")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_mig_manager.service import run

    await run(bus, args.node, devices_from(args.nvml, args.node), reconcile_s=args.reconcile_s,
              orphan_grace_s=args.orphan_grace_s, task_status=task_status)
