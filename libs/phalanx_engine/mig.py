"""MIG profile tables and slot choice (R3): which profile a ``gpu-slice`` request becomes on a
given GPU model, where on the GPU its instance may start, and which start keeps larger
profiles possible.

Used by ``phalanx_engine.gpumodel.check_gpu_model`` (is the request possible on this model
at all), by the placement service (GPU and start slot for a MIG member), and by the fake
NVML adapter (the same placement rules). Pure data and functions.

Sources (NVIDIA Multi-Instance GPU User Guide):

* profile names and sizes per product -
  https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
* legal placements, from ``nvidia-smi mig -lgipp`` in "Getting Started with MIG" -
  https://docs.nvidia.com/datacenter/tesla/mig-user-guide/getting-started-with-mig.html
  (A100/H100: ``{0,1,2,3,4,5,6}:1``, ``{0,2,4,6}:2`` for the double-memory 1g profile,
  ``{0,2,4}:2``, ``{0,4}:4``, ``{0}:4``, ``{0}:8``; the A30 has four memory slices:
  ``{0,1,2,3}:1``, ``{0,2}:2``, ``{0}:4``).

A start and a size are in *memory slices* (8 on A100/H100/H200/B200, 4 on A30), as NVML's
``nvmlGpuInstancePlacement_t``. On these layouts the memory-slice rule is the only one that
binds: no non-overlapping set of legal placements uses more compute slices than the GPU has.
Media-extension (``+me``) profiles are left out: a pod cannot ask for them.

Memory is matched against a profile's *nominal* size, the number in its name read as GiB
(``gpu-slice: 1`` + ``gpu-memory: 5`` fits ``1g.5gb``), because that is what users read in
the profile list; the usable memory is a few hundred MiB less.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

from phalanx_engine.gpuset import NoChoice


class MigProfile(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU-instance profile: ``name`` as nvidia-smi prints it (``3g.20gb``), compute
    ``slices``, nominal ``memory_gib``, ``size`` in memory slices, legal ``starts``."""

    name: str
    slices: int
    memory_gib: int
    size: int
    starts: tuple[int, ...]


class MigTable(msgspec.Struct, frozen=True, kw_only=True):
    """The MIG profiles of one GPU model with ``memory_slices`` placement slots."""

    model: str
    memory_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


class MigInstance(msgspec.Struct, frozen=True, kw_only=True):
    """An existing (or booked) GPU instance: its profile name and start slot."""

    profile: str
    start: int


class MigSlot(msgspec.Struct, frozen=True, kw_only=True):
    """Where a new instance goes: GPU index (-1 when only one GPU was considered), profile,
    start and size in memory slices."""

    gpu: int = -1
    profile: str
    start: int
    size: int


class MigGpu(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG-enabled GPU as a choice input: its table and its current instances."""

    table: MigTable
    instances: tuple[MigInstance, ...] = ()


def _eight(model: str, mem: tuple[int, int, int, int, int, int]) -> MigTable:
    """The A100/H100-class layout: 8 memory slices, 7 compute slices."""
    m1, m1x2, m2, m3, m4, m7 = mem
    return MigTable(model=model, memory_slices=8, profiles=(
        MigProfile(name=f"1g.{m1}gb", slices=1, memory_gib=m1, size=1, starts=(0, 1, 2, 3, 4, 5, 6)),
        MigProfile(name=f"1g.{m1x2}gb", slices=1, memory_gib=m1x2, size=2, starts=(0, 2, 4, 6)),
        MigProfile(name=f"2g.{m2}gb", slices=2, memory_gib=m2, size=2, starts=(0, 2, 4)),
        MigProfile(name=f"3g.{m3}gb", slices=3, memory_gib=m3, size=4, starts=(0, 4)),
        MigProfile(name=f"4g.{m4}gb", slices=4, memory_gib=m4, size=4, starts=(0,)),
        MigProfile(name=f"7g.{m7}gb", slices=7, memory_gib=m7, size=8, starts=(0,)),
    ))


TABLES: Mapping[str, MigTable] = {
    t.model: t
    for t in (
        _eight("A100-40GB", (5, 10, 10, 20, 20, 40)),
        _eight("A100-80GB", (10, 20, 20, 40, 40, 80)),
        _eight("H100-80GB", (10, 20, 20, 40, 40, 80)),
        _eight("H800-80GB", (10, 20, 20, 40, 40, 80)),
        _eight("H100-94GB", (12, 24, 24, 47, 47, 94)),
        _eight("H200-141GB", (18, 35, 35, 71, 71, 141)),
        _eight("B200-180GB", (23, 45, 45, 90, 90, 180)),
        MigTable(model="A30-24GB", memory_slices=4, profiles=(
            MigProfile(name="1g.6gb", slices=1, memory_gib=6, size=1, starts=(0, 1, 2, 3)),
            MigProfile(name="2g.12gb", slices=2, memory_gib=12, size=2, starts=(0, 2)),
            MigProfile(name="4g.24gb", slices=4, memory_gib=24, size=4, starts=(0,)),
        )),
    )
}
"""Profile tables by model key."""

MIG_FAMILIES = ("A100", "A800", "A30", "H100", "H800", "H200", "H20", "GH200", "B200", "GB200", "B300",
                "RTX PRO 6000 BLACKWELL", "RTX PRO 5000 BLACKWELL")
"""Model families that support MIG (the guide's supported-GPU list, plus the A800/H800
export variants the seed names). Not every family has a profile table here."""

_FAMILY = re.compile(r"(?<![A-Z0-9])(" + "|".join(re.escape(f) for f in MIG_FAMILIES) + r")(?![0-9])")
_GB = re.compile(r"(\d+)\s*GB\b")


def mig_family(model: str) -> str:
    """The MIG-capable family named in a model string (``"NVIDIA A100-SXM4-40GB"`` -> ``A100``),
    or ``""`` when the model does not support MIG."""
    m = _FAMILY.search(" ".join(model.upper().replace("_", " ").split()))
    return m.group(1) if m else ""


def mig_capable(model: str) -> bool:
    """Whether the GPU model supports MIG at all."""
    return bool(mig_family(model))


def mig_table(model: str, memory_mib: int = 0) -> MigTable | None:
    """The profile table for a model name as NVML reports it (``memory_mib`` helps when the
    name carries no size), or None when the model has no MIG or no table here."""
    family = mig_family(model)
    sizes = [int(x) for x in _GB.findall(model.upper())]
    gib = sizes[-1] if sizes else round(memory_mib / 1024)
    match family:
        case "A100" | "A800":
            return TABLES["A100-80GB" if gib >= 60 else "A100-40GB"]
        case "A30":
            return TABLES["A30-24GB"]
        case "H100" | "H800":
            if gib >= 90 or "NVL" in model.upper():
                return TABLES["H100-94GB"]
            return TABLES[f"{family}-80GB"]
        case "H200":
            return TABLES["H200-141GB"]
        case "B200":
            return TABLES["B200-180GB"]
    return None


def profile_for(table: MigTable, slices: int, memory_mib: int = 0) -> MigProfile | None:
    """The smallest profile with exactly ``slices`` compute slices whose nominal memory holds
    ``memory_mib``; None when there is none."""
    fits = [p for p in table.profiles if p.slices == slices and p.memory_gib * 1024 >= memory_mib]
    return min(fits, key=lambda p: (p.memory_gib, p.size), default=None)


def layout_problems(table: MigTable, instances: Iterable[MigInstance]) -> tuple[str, ...]:
    """Why a set of instances cannot exist on one GPU: unknown profile, illegal start, or
    overlapping memory slices. Empty when the layout is legal."""
    problems: list[str] = []
    taken: dict[int, str] = {}
    for inst in instances:
        p = table.profile(inst.profile)
        if p is None:
            problems.append(f"profile {inst.profile!r} does not exist on {table.model} "
                            f"(has {', '.join(x.name for x in table.profiles)})")
            continue
        if inst.start not in p.starts:
            problems.append(f"{p.name} cannot start at slot {inst.start} on {table.model} "
                            f"(legal starts {list(p.starts)})")
            continue
        for s in range(inst.start, inst.start + p.size):
            if s in taken:
                problems.append(f"{p.name}@{inst.start} overlaps {taken[s]} at memory slice {s}")
                break
        else:
            for s in range(inst.start, inst.start + p.size):
                taken[s] = f"{p.name}@{inst.start}"
    return tuple(problems)


def place(
    table: MigTable, instances: Iterable[MigInstance], profile: str, start: int | None = None
) -> MigSlot | NoChoice:
    """Where a new ``profile`` instance goes on a GPU that already has ``instances``.

    With ``start`` given, that start is checked (legal for the profile, no overlap). Without
    it, the legal free start that keeps the most capacity (``capacity`` after placing) wins;
    ties go to the highest start, since the big profiles all start at slot 0. Raises
    ``ValueError`` when the existing layout itself is illegal (a broken invariant).
    """
    existing = tuple(instances)
    broken = layout_problems(table, existing)
    if broken:
        raise ValueError(f"illegal existing MIG layout on {table.model}: {'; '.join(broken)}")
    p = table.profile(profile)
    if p is None:
        return NoChoice(code="mig-unknown-profile",
                     reasons=(f"profile {profile!r} does not exist on {table.model}",))
    used = _used(table, existing)
    if start is not None:
        problems = layout_problems(table, (*existing, MigInstance(profile=profile, start=start)))
        if problems:
            return NoChoice(code="mig-illegal-slot", reasons=problems)
        return MigSlot(profile=p.name, start=start, size=p.size)
    options = [s for s in p.starts if not used & _span(s, p.size)]
    if not options:
        return NoChoice(code="mig-no-free-slot",
                     reasons=(f"no free start for {p.name} on {table.model} "
                              f"(legal starts {list(p.starts)}, used slices {_bits(used)})",))
    best = max(options, key=lambda s: (capacity(table, used | _span(s, p.size)), s))
    return MigSlot(profile=p.name, start=best, size=p.size)


def choose_gpu(gpus: Mapping[int, MigGpu], slices: int, memory_mib: int = 0) -> MigSlot | NoChoice:
    """The GPU and start for a ``slices``/``memory_mib`` request among MIG-enabled GPUs.

    Each GPU's own profile is resolved from its table; the GPU whose capacity drops least
    (lexicographically over 7g, 4g, 3g, 2g, 1g) wins, so partly used GPUs fill up before an
    empty one is cut; ties go to the lowest GPU index.
    """
    best: tuple[tuple[int, ...], int, MigSlot] | None = None
    reasons = []
    for index in sorted(gpus):
        gpu = gpus[index]
        prof = profile_for(gpu.table, slices, memory_mib)
        if prof is None:
            reasons.append(f"GPU {index} ({gpu.table.model}) has no {slices}-slice profile with "
                           f"{memory_mib} MiB")
            continue
        slot = place(gpu.table, gpu.instances, prof.name)
        if isinstance(slot, NoChoice):
            reasons.extend(f"GPU {index}: {r}" for r in slot.reasons)
            continue
        used = _used(gpu.table, gpu.instances)
        before = capacity(gpu.table, used)
        after = capacity(gpu.table, used | _span(slot.start, slot.size))
        loss = tuple(a - b for a, b in zip(after, before, strict=True))
        if best is None or (loss, -index) > (best[0], -best[1]):
            best = (loss, index, MigSlot(gpu=index, profile=slot.profile, start=slot.start, size=slot.size))
    if best is None:
        return NoChoice(code="mig-no-fit", reasons=tuple(reasons) or ("no MIG-enabled GPU",))
    return best[2]


def capacity(table: MigTable, used: int) -> tuple[int, ...]:
    """How many instances of each compute size (7, 4, 3, 2, 1 slices) could still be made,
    each size counted alone, on a GPU whose memory slices ``used`` (a bit mask) are taken."""
    out = []
    for slices in (7, 4, 3, 2, 1):
        best = 0
        for p in table.profiles:
            if p.slices != slices:
                continue
            taken, n = used, 0
            for s in p.starts:  # equal-size aligned intervals: earliest-first greedy is optimal
                if not taken & _span(s, p.size):
                    taken |= _span(s, p.size)
                    n += 1
            best = max(best, n)
        out.append(best)
    return tuple(out)


def _span(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def _used(table: MigTable, instances: Iterable[MigInstance]) -> int:
    used = 0
    for inst in instances:
        p = table.profile(inst.profile)
        if p is not None:
            used |= _span(inst.start, p.size)
    return used


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
