"""MIG profile tables (NVIDIA MIG user guide), legal start slots, and slot/GPU choice that keeps
larger profiles possible (R3)."""

from __future__ import annotations

import pytest

from phalanx_engine.gpuset import NoChoice
from phalanx_engine.mig import (
    TABLES,
    MigGpu,
    MigInstance,
    MigProfile,
    MigSlot,
    capacity,
    choose_gpu,
    layout_problems,
    mig_capable,
    mig_table,
    place,
    profile_for,
)


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


A100 = TABLES["A100-40GB"]
A30 = TABLES["A30-24GB"]


def inst(spec: str) -> MigInstance:
    """``"3g.20gb@4"`` -> MigInstance(profile="3g.20gb", start=4)."""
    profile, _, start = spec.partition("@")
    return MigInstance(profile=profile, start=int(start))


def layout(*specs: str) -> tuple[MigInstance, ...]:
    return tuple(inst(s) for s in specs)


def test_mig_profiles_a100_40gb_table_is_the_user_guide_geometry() -> None:
    assert A100.memory_slices == 8
    assert A100.profiles == (
        MigProfile(name="1g.5gb", slices=1, memory_gib=5, size=1, starts=(0, 1, 2, 3, 4, 5, 6)),
        MigProfile(name="1g.10gb", slices=1, memory_gib=10, size=2, starts=(0, 2, 4, 6)),
        MigProfile(name="2g.10gb", slices=2, memory_gib=10, size=2, starts=(0, 2, 4)),
        MigProfile(name="3g.20gb", slices=3, memory_gib=20, size=4, starts=(0, 4)),
        MigProfile(name="4g.20gb", slices=4, memory_gib=20, size=4, starts=(0,)),
        MigProfile(name="7g.40gb", slices=7, memory_gib=40, size=8, starts=(0,)),
    )


@pytest.mark.parametrize(("model", "names"), [
    ("A100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H800-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("H200-141GB", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("A30-24GB", ["1g.6gb", "2g.12gb", "4g.24gb"]),
])
def test_mig_profiles_tables_name_the_user_guide_profiles(model: str, names: list[str]) -> None:
    assert [p.name for p in TABLES[model].profiles] == names


@pytest.mark.parametrize(("case", "model", "memory_mib", "table"), cases(
    ("an A100 SXM4 40GB", "NVIDIA A100-SXM4-40GB", 0, "A100-40GB"),
    ("an A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", 0, "A100-80GB"),
    ("an A100 named without size uses its memory", "NVIDIA A100-SXM4", 81920, "A100-80GB"),
    ("an A800 uses the A100 table", "NVIDIA A800-SXM4-80GB", 0, "A100-80GB"),
    ("an H100 SXM5", "NVIDIA H100 80GB HBM3", 0, "H100-80GB"),
    ("an H100 NVL", "NVIDIA H100 NVL", 0, "H100-94GB"),
    ("the seed's H800", "NVIDIA H800", 0, "H800-80GB"),
    ("an H200", "NVIDIA H200", 0, "H200-141GB"),
    ("a B200", "NVIDIA B200", 0, "B200-180GB"),
    ("an A30", "NVIDIA A30", 0, "A30-24GB"),
    ("a V100 has no MIG", "Tesla V100-SXM2-16GB", 0, None),
    ("an RTX A3000 is not an A30", "NVIDIA RTX A3000 Laptop GPU", 0, None),
    ("an H20 supports MIG but has no table here", "NVIDIA H20", 0, None),
))
def test_mig_profiles_table_for_a_model_name(case: str, model: str, memory_mib: int, table: str | None) -> None:
    found = mig_table(model, memory_mib)
    assert (found.model if found else None) == table


@pytest.mark.parametrize(("model", "capable"), [
    ("NVIDIA A100-SXM4-40GB", True), ("NVIDIA H800", True), ("NVIDIA H20", True), ("NVIDIA GH200 480GB", True),
    ("NVIDIA H200", True), ("NVIDIA B200", True), ("Tesla V100-SXM2-16GB", False), ("NVIDIA L40S", False),
    ("NVIDIA GeForce RTX 4090", False), ("NVIDIA A10", False), ("PPU 810E", False),
])
def test_mig_profiles_capable_models(model: str, capable: bool) -> None:
    assert mig_capable(model) is capable


@pytest.mark.parametrize(("case", "table", "slices", "memory_mib", "profile"), cases(
    ("the seed's 3 slices and 4 GiB is a 3g.20gb on an A100 40GB", "A100-40GB", 3, 4096, "3g.20gb"),
    ("1 slice with 5 GiB fits the nominal 1g.5gb", "A100-40GB", 1, 5120, "1g.5gb"),
    ("1 slice with 8 GiB needs the double-memory 1g.10gb", "A100-40GB", 1, 8192, "1g.10gb"),
    ("1 slice with 20 GiB has no profile", "A100-40GB", 1, 20480, None),
    ("7 slices is the whole GPU", "A100-40GB", 7, 0, "7g.40gb"),
    ("2 slices on an H200 is 2g.35gb", "H200-141GB", 2, 0, "2g.35gb"),
    ("3 slices do not exist on an A30", "A30-24GB", 3, 0, None),
))
def test_mig_profiles_profile_for_a_request(case: str, table: str, slices: int, memory_mib: int,
                                            profile: str | None) -> None:
    found = profile_for(TABLES[table], slices, memory_mib)
    assert (found.name if found else None) == profile


@pytest.mark.parametrize(("case", "existing", "profile", "start"), cases(
    ("a 1g on an empty GPU goes to slot 6, keeping 4g and 3g possible", (), "1g.5gb", 6),
    ("a double-memory 1g on an empty GPU goes to slot 6", (), "1g.10gb", 6),
    ("a 2g on an empty GPU goes to slot 4, keeping the 4g at 0", (), "2g.10gb", 4),
    ("a 3g on an empty GPU goes to slot 4, keeping the 4g at 0", (), "3g.20gb", 4),
    ("a 4g can only start at 0", (), "4g.20gb", 0),
    ("a 7g takes the whole GPU from 0", (), "7g.40gb", 0),
    ("a second 1g goes next to the first, from the top", ("1g.5gb@6",), "1g.5gb", 5),
    ("a 3g next to a 1g at 6 starts at 0", ("1g.5gb@6",), "3g.20gb", 0),
    ("a 4g still fits after three 1g from the top", ("1g.5gb@6", "1g.5gb@5", "1g.5gb@4"), "4g.20gb", 0),
    ("a 2g next to a 3g at 4 leaves room for another 2g", ("3g.20gb@4",), "2g.10gb", 2),
))
def test_mig_profiles_place_keeps_larger_profiles_possible(case: str, existing: tuple[str, ...], profile: str,
                                                           start: int) -> None:
    slot = place(A100, layout(*existing), profile)
    assert isinstance(slot, MigSlot) and slot.start == start


@pytest.mark.parametrize(("case", "existing", "profile", "start", "expected"), cases(
    ("a start that is not a legal placement is refused", (), "2g.10gb", 1,
     NoChoice(code="mig-illegal-slot",
           reasons=("2g.10gb cannot start at slot 1 on A100-40GB (legal starts [0, 2, 4])",))),
    ("a 1g cannot use memory slice 7", (), "1g.5gb", 7,
     NoChoice(code="mig-illegal-slot",
           reasons=("1g.5gb cannot start at slot 7 on A100-40GB (legal starts [0, 1, 2, 3, 4, 5, 6])",))),
    ("an overlapping start is refused", ("3g.20gb@0",), "2g.10gb", 2,
     NoChoice(code="mig-illegal-slot", reasons=("2g.10gb@2 overlaps 3g.20gb@0 at memory slice 2",))),
    ("a full GPU has no free slot", ("7g.40gb@0",), "1g.5gb", None,
     NoChoice(code="mig-no-free-slot",
           reasons=("no free start for 1g.5gb on A100-40GB (legal starts [0, 1, 2, 3, 4, 5, 6], used slices "
                    "[0, 1, 2, 3, 4, 5, 6, 7])",))),
    ("a 4g after a 2g at 0 has nowhere to go", ("2g.10gb@0",), "4g.20gb", None,
     NoChoice(code="mig-no-free-slot",
           reasons=("no free start for 4g.20gb on A100-40GB (legal starts [0], used slices [0, 1])",))),
    ("a profile of another model is unknown", (), "3g.40gb", None,
     NoChoice(code="mig-unknown-profile", reasons=("profile '3g.40gb' does not exist on A100-40GB",))),
))
def test_mig_profiles_illegal_slots_and_overlaps_are_refused(case: str, existing: tuple[str, ...], profile: str,
                                                             start: int | None, expected: NoChoice) -> None:
    assert place(A100, layout(*existing), profile, start) == expected


def test_mig_profiles_explicit_legal_start_is_accepted() -> None:
    assert place(A100, layout("4g.20gb@0"), "3g.20gb", 4) == MigSlot(profile="3g.20gb", start=4, size=4)


def test_mig_profiles_an_illegal_existing_layout_is_a_broken_invariant() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        place(A100, layout("4g.20gb@0", "2g.10gb@2"), "1g.5gb")


@pytest.mark.parametrize(("case", "instances", "problems"), cases(
    ("4g plus 3g is a legal full split", ("4g.20gb@0", "3g.20gb@4"), ()),
    ("two 3g are legal", ("3g.20gb@0", "3g.20gb@4"), ()),
    ("three 2g and a 1g fill all seven compute slices", ("2g.10gb@0", "2g.10gb@2", "2g.10gb@4", "1g.5gb@6"), ()),
    ("a 2g inside a 4g overlaps", ("4g.20gb@0", "2g.10gb@2"), ("2g.10gb@2 overlaps 4g.20gb@0 at memory slice 2",)),
    ("a 3g at 2 is not a legal start", ("3g.20gb@2",),
     ("3g.20gb cannot start at slot 2 on A100-40GB (legal starts [0, 4])",)),
    ("an unknown profile is named", ("9g.1gb@0",),
     ("profile '9g.1gb' does not exist on A100-40GB (has 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)",)),
))
def test_mig_profiles_layout_problems(case: str, instances: tuple[str, ...], problems: tuple[str, ...]) -> None:
    assert layout_problems(A100, layout(*instances)) == problems


def test_mig_profiles_capacity_counts_each_compute_size_alone() -> None:
    assert capacity(A100, 0) == (1, 1, 2, 3, 7)
    assert capacity(A30, 0) == (0, 1, 0, 2, 4)
    assert capacity(A100, 0b0100_0000) == (0, 1, 1, 3, 6)  # a 1g at slot 6


@pytest.mark.parametrize(("case", "gpus", "slices", "memory_mib", "expected"), cases(
    ("a 1g goes onto the partly used GPU, not the empty one",
     {0: MigGpu(table=A100), 1: MigGpu(table=A100, instances=layout("1g.5gb@6"))}, 1, 0,
     MigSlot(gpu=1, profile="1g.5gb", start=5, size=1)),
    ("a 7g goes to the empty GPU", {0: MigGpu(table=A100, instances=layout("1g.5gb@6")), 1: MigGpu(table=A100)},
     7, 0, MigSlot(gpu=1, profile="7g.40gb", start=0, size=8)),
    ("equal GPUs go to the lowest index", {0: MigGpu(table=A100), 1: MigGpu(table=A100)}, 3, 4096,
     MigSlot(gpu=0, profile="3g.20gb", start=4, size=4)),
    ("a 3-slice request skips the A30", {0: MigGpu(table=A30), 1: MigGpu(table=A100)}, 3, 0,
     MigSlot(gpu=1, profile="3g.20gb", start=4, size=4)),
    ("no GPU fits a request that is too big",
     {0: MigGpu(table=A100, instances=layout("7g.40gb@0")), 1: MigGpu(table=A30, instances=layout("1g.6gb@3"))},
     4, 0, NoChoice(code="mig-no-fit", reasons=(
         "GPU 0: no free start for 4g.20gb on A100-40GB (legal starts [0], used slices [0, 1, 2, 3, 4, 5, 6, 7])",
         "GPU 1: no free start for 4g.24gb on A30-24GB (legal starts [0], used slices [3])",
     ))),
    ("a GPU without a matching profile says so", {0: MigGpu(table=A30)}, 3, 2048,
     NoChoice(code="mig-no-fit", reasons=("GPU 0 (A30-24GB) has no 3-slice profile with 2048 MiB",))),
))
def test_mig_profiles_choose_gpu_packs_partly_used_gpus_first(case: str, gpus: dict[int, MigGpu], slices: int,
                                                              memory_mib: int, expected: MigSlot | NoChoice) -> None:
    assert choose_gpu(gpus, slices, memory_mib) == expected
