"""What the DRA allocator (``phalanx_engine.dra.allocate``) costs per (pod, node), first-fit against
ranked.

One node as the NVIDIA DRA driver publishes it with dynamic MIG: 8 GPUs (the V100 cube-mesh
topology of ``tests/fixtures/topology``, UUIDs joined), each with its counter set and all 18 MIG
placements (152 devices in one partitionable pool), plus a NIC driver with 8 NICs (two per PCIe
root). For each typical claim the allocator is warmed up once (selectors compiled, every device's
answers kept, as placement's ``NodeDevices`` keeps them), then timed: upstream's first-fit order
(``Ranking(topology, connected=False)``) and Phalanx's ranked order (``Ranking(topology)``) side by
side, in microseconds per call (median and p99 of ``--repeat`` calls, CPU time), with the GPUs each
chose. Pure Python, a few seconds.

Usage (from the repository root)::

    .venv/bin/python bench/dra_allocator.py
    .venv/bin/python bench/dra_allocator.py --repeat 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # the NVIDIA-shaped slice builders of the tests

from dra_builders import (  # noqa: E402
    MIG_CLASS,
    NIC_CLASS,
    claim,
    distinct,
    gpu_pool,
    match,
    nic_pool,
    pci,
    request,
)

from phalanx_engine.dra import Allocation, Ranking, Usage, allocate, gather  # noqa: E402
from phalanx_proto.dra import ClaimSpec  # noqa: E402
from phalanx_topology import load_file  # noqa: E402

ROOT_ATTR = "resource.kubernetes.io/pcieRoot"
CLAIMS: dict[str, list[ClaimSpec]] = {
    "1 GPU": [claim("c", request("gpu"))],
    "4 GPUs": [claim("c", request("gpu", count=4))],
    "8 GPUs (refused: GPU 1 has MIG)": [claim("c", request("gpu", count=8))],
    "2 GPUs + NIC on their root": [claim("c", request("gpu", count=2), request("nic", NIC_CLASS),
                                         constraints=[match(ROOT_ATTR)])],
    "1 MIG 1g.10gb": [claim("c", request("m", MIG_CLASS, selectors=[
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"]))],
    "2 MIG 3g.40gb, distinct GPUs": [claim("c", request("m", MIG_CLASS, count=2, selectors=[
        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"]),
                                           constraints=[distinct("resource.kubernetes.io/pciBusID")])],
}


def topology():
    t = load_file(ROOT / "tests/fixtures/topology/dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", node="n1")
    gpus = tuple(msgspec.structs.replace(g, uuid=f"GPU-{g.index:08d}", pci_bus_id=pci(g.index)) for g in t.gpus)
    return msgspec.structs.replace(t, gpus=gpus)


def timed(claims: list[ClaimSpec], devices, usage: Usage, ranking: Ranking, repeat: int) -> tuple[float, float, object]:
    result = allocate(claims, devices, usage, ranking)  # warm-up: selectors compiled, answers kept
    samples = []
    for _ in range(repeat):
        t0 = time.process_time_ns()
        allocate(claims, devices, usage, ranking)
        samples.append((time.process_time_ns() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000, help="timed calls per claim and order (default 2000)")
    args = parser.parse_args(argv)
    topo = topology()
    pools = [gpu_pool("n1", 8, mig=True, in_use=["gpu-1-mig-1g10gb-0"]), nic_pool("n1", 8)]
    t0 = time.perf_counter()
    devices = gather(pools, "n1")
    usage = Usage(pools)
    print(f"node: {len(devices.candidates)} devices ({sum(len(p.candidates) for p in devices.pools[:1])} NVIDIA, "
          f"GPU 1 has a MIG device in use), gathered in {1000 * (time.perf_counter() - t0):.1f} ms")
    print(f"{'claim':32} {'first-fit µs p50/p99':>22} {'ranked µs p50/p99':>20}   first-fit GPUs -> ranked GPUs")
    for name, claims in CLAIMS.items():
        ff = timed(claims, devices, usage, Ranking(topo, connected=False), args.repeat)
        rk = timed(claims, devices, usage, Ranking(topo), args.repeat)
        gpus = [r.gpus if isinstance(r, Allocation) else "refused" for r in (ff[2], rk[2])]
        print(f"{name:32} {ff[0]:>12.0f} / {ff[1]:<7.0f} {rk[0]:>10.0f} / {rk[1]:<7.0f}   {gpus[0]} -> {gpus[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
