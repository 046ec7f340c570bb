"""PCIe facts from sysfs, and the nvidia-smi relation two devices have from their PCI paths.

NVML knows how GPUs relate to each other, but not NICs. For a NIC the adapter reads
``/sys/class/infiniband/<dev>/device`` (a symlink to the PCI function) and compares PCI paths:

* the path of a device is the chain of directories under ``/sys/devices`` from its host
  bridge (``pci0000:00``) through root port and switch ports to the function itself;
* same host bridge: meeting at the host bridge is ``PHB``; meeting lower, within one switch
  (at most two levels below the meeting point: downstream port + device) is ``PIX``; deeper
  (nested switches) is ``PXB``;
* different host bridges: ``NODE`` or ``SYS``, decided by the caller (it knows how GPUs on
  those bridges relate, from NVML) or, for a bridge without GPUs, by NUMA node.

``sysfs_root`` lets tests (and ``phalanx_nvmlfake.nvml``) point all of this at a temporary tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from phalanx_topology.model import canonical_cpulist

_BUS_ID = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's ``00000000:07:00.0`` (or sysfs's ``0000:07:00.0``) as ``0000:07:00.0``, lower case;
    raises ValueError for a string that is not a PCI address."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    m = _BUS_ID.fullmatch(bus_id.strip())
    if not m:
        raise ValueError(f"{bus_id!r} is not a PCI bus id (domain:bus:device.function)")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass(frozen=True, slots=True)
class PciDevice:
    """A PCI function as sysfs shows it. ``path`` runs from the host bridge to the device."""

    bus_id: str
    path: tuple[str, ...]
    numa: int = -1
    cpu_affinity: str = ""

    @property
    def root(self) -> str:
        return self.path[0]


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """An entry of ``/sys/class/infiniband`` backed by a PCI function."""

    name: str
    pci: PciDevice


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _pci_device(real: Path, devices_dir: Path) -> PciDevice | None:
    """The PCI function at sysfs directory ``real``, or None when it is not under a host bridge."""
    try:
        rel = real.relative_to(devices_dir)
    except ValueError:
        return None
    if not rel.parts or not rel.parts[0].startswith("pci"):
        return None
    numa_text = _read(real / "numa_node")
    numa = int(numa_text) if numa_text.lstrip("-").isdigit() else -1
    try:
        cpus = canonical_cpulist(_read(real / "local_cpulist"))
    except ValueError:
        cpus = ""
    return PciDevice(bus_id=normalize_bus_id(real.name), path=rel.parts, numa=max(numa, -1), cpu_affinity=cpus)


def pci_device(sysfs_root: str | Path, bus_id: str) -> PciDevice | None:
    """``/sys/bus/pci/devices/<bus_id>`` resolved, or None when sysfs does not have it."""
    root = Path(sysfs_root)
    link = root / "sys" / "bus" / "pci" / "devices" / bus_id
    if not link.exists():
        return None
    return _pci_device(Path(os.path.realpath(link)), Path(os.path.realpath(root / "sys" / "devices")))


def rdma_devices(sysfs_root: str | Path) -> tuple[RdmaDevice, ...]:
    """Every RDMA device backed by a PCI function, in natural name order (``mlx5_2`` before
    ``mlx5_10``). Software devices (``rxe0``, ``siw0``) have no PCI function and are skipped."""
    root = Path(sysfs_root)
    ib = root / "sys" / "class" / "infiniband"
    if not ib.is_dir():
        return ()
    devices_dir = Path(os.path.realpath(root / "sys" / "devices"))
    found = []
    for entry in sorted(ib.iterdir(), key=lambda p: natural_key(p.name)):
        target = entry / "device"
        if not target.exists():
            continue
        pci = _pci_device(Path(os.path.realpath(target)), devices_dir)
        if pci is not None:
            found.append(RdmaDevice(name=entry.name, pci=pci))
    return tuple(found)


def natural_key(name: str) -> tuple:
    """Sort key that orders the digit runs numerically: ``mlx5_2`` < ``mlx5_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def same_bridge_relation(a: tuple[str, ...], b: tuple[str, ...]) -> str:
    """``PIX``, ``PXB`` or ``PHB`` for two PCI paths under one host bridge (see module doc)."""
    if a[0] != b[0]:
        raise ValueError(f"{a[0]} and {b[0]} are different host bridges")
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"
    hops = max(len(a), len(b)) - common
    return "PIX" if hops <= 2 else "PXB"


def numa_relation(numa_a: int, numa_b: int) -> str:
    """Devices on different host bridges without a GPU to ask NVML about: ``NODE`` within one
    known NUMA node, ``SYS`` otherwise (unknown counts as far)."""
    return "NODE" if numa_a >= 0 and numa_a == numa_b else "SYS"


def socket_of_numa(sysfs_root: str | Path, numa: int) -> int:
    """The CPU package of NUMA node ``numa`` (``physical_package_id`` of its first CPU), or -1."""
    if numa < 0:
        return -1
    root = Path(sysfs_root) / "sys" / "devices" / "system"
    cpulist = _read(root / "node" / f"node{numa}" / "cpulist")
    if not cpulist:
        return -1
    first = cpulist.split(",")[0].split("-")[0]
    package = _read(root / "cpu" / f"cpu{first}" / "topology" / "physical_package_id")
    return int(package) if package.isdigit() else -1
