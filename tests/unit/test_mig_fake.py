"""The real MIG adapter (``NvmlMig``) on the fake NVML: the driver's rules per model, taken from
``phalanx_engine.mig.TABLES``, and the failure injection fail-closed tests rely on."""

from __future__ import annotations

import pynvml
import pytest

from phalanx_engine.mig import TABLES, MigInstance
from phalanx_nvml import MigError, MigInstanceInfo, NvmlMig
from phalanx_nvmlfake.mig import FakeMigNvml, from_spec


def mig(model: str = "A100-40GB", count: int = 1, *, enabled: bool = True) -> tuple[NvmlMig, FakeMigNvml]:
    fake = FakeMigNvml.of(model, count, mig_enabled=enabled)
    return NvmlMig(fake), fake


REFUSALS = [
    # (case, model, existing (profile, start), new profile, start, NVML code)
    ("a 3g profile cannot start at slot 2 on an A100", "A100-40GB", [], "3g.20gb", 2, pynvml.NVML_ERROR_INVALID_ARGUMENT),
    ("a 7g profile only starts at slot 0", "H100-80GB", [], "7g.80gb", 1, pynvml.NVML_ERROR_INVALID_ARGUMENT),
    ("a 2g instance overlapping a 3g one is out of resources", "A100-40GB", [("3g.20gb", 0)], "2g.10gb", 2,
     pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
    ("a second 7g instance does not fit", "H200-141GB", [("7g.141gb", 0)], "7g.141gb", 0,
     pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
    ("an A100-40GB profile name does not exist on an H100", "H100-80GB", [], "1g.5gb", 0,
     pynvml.NVML_ERROR_NOT_SUPPORTED),
    ("the A30 has no 3g profile", "A30-24GB", [], "3g.12gb", 0, pynvml.NVML_ERROR_NOT_SUPPORTED),
    ("the A30 has only four memory slices", "A30-24GB", [], "1g.6gb", 4, pynvml.NVML_ERROR_INVALID_ARGUMENT),
]


@pytest.mark.parametrize(("case", "model", "existing", "profile", "start", "code"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_the_fake_refuses_what_the_driver_refuses(case, model, existing, profile, start, code):
    m, fake = mig(model)
    for p, s in existing:
        m.create(0, p, s)
    with pytest.raises(MigError) as err:
        m.create(0, profile, start)
    assert err.value.code == code, case
    assert fake.layout(0) == tuple(MigInstance(profile=p, start=s) for p, s in existing)


@pytest.mark.parametrize("model", sorted(TABLES))
def test_every_legal_start_of_every_profile_can_be_created_on_an_empty_gpu(model):
    m, fake = mig(model)
    for p in TABLES[model].profiles:
        for s in p.starts:
            gi = m.create(0, p.name, s)
            [inst] = m.list_instances(0)
            assert (inst.profile, inst.start, inst.size, inst.gi_id) == (p.name, s, p.size, gi)
            assert inst.uuid.startswith("MIG-") and inst.ci_ids == (0,)
            assert m.destroy(0, gi)
    assert fake.layout(0) == ()


def test_a_full_seven_way_split_of_an_h100_is_listed_with_distinct_uuids():
    m, _ = mig("H100-80GB")
    for s in range(7):
        m.create(0, "1g.10gb", s)
    listed = m.list_instances(0)
    assert [i.start for i in listed] == list(range(7))
    assert len({i.uuid for i in listed}) == 7
    with pytest.raises(MigError) as err:
        m.create(0, "1g.10gb", 7)
    assert err.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_a_gpu_not_in_mig_mode_reports_it_and_refuses_creates():
    m, fake = mig("A100-80GB", enabled=False)
    assert m.mig_enabled(0) is False
    with pytest.raises(MigError) as err:
        m.create(0, "1g.10gb", 0)
    assert err.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.set_mig_mode(0, True)  # what the admin's nvidia-smi -mig 1 does
    assert m.mig_enabled(0) is True
    m.create(0, "1g.10gb", 0)


def test_a_model_without_mig_says_not_supported():
    m = NvmlMig(from_spec("V100-32GBx1"))
    with pytest.raises(MigError) as err:
        m.mig_enabled(0)
    assert err.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_destroying_twice_is_harmless_and_reports_nothing_the_second_time():
    m, fake = mig("A100-40GB")
    gi = m.create(0, "2g.10gb", 2)
    assert m.destroy(0, gi) is True
    assert m.destroy(0, gi) is False
    assert m.destroy(0, 99) is False
    assert fake.layout(0) == ()


def test_mig_mode_cannot_be_switched_while_instances_exist():
    m, fake = mig("A100-40GB")
    m.create(0, "1g.5gb", 0)
    with pytest.raises(pynvml.NVMLError):
        fake.set_mig_mode(0, False)


def test_an_injected_create_error_leaves_nothing_behind():
    m, fake = mig("H100-80GB")
    fake.fail_next_create(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(MigError) as err:
        m.create(0, "3g.40gb", 0)
    assert err.value.code == pynvml.NVML_ERROR_UNKNOWN
    assert m.list_instances(0) == ()
    m.create(0, "3g.40gb", 0)  # one shot


def test_a_phantom_create_returns_but_is_never_listed():
    m, fake = mig("H100-80GB")
    fake.phantom_next_create()
    m.create(0, "3g.40gb", 4)
    assert m.list_instances(0) == ()
    assert fake.creates == 1


def test_instances_on_two_gpus_are_listed_per_gpu():
    m, _ = mig("A30-24GB", 2)
    m.create(1, "2g.12gb", 2)
    assert m.list_instances(0) == ()
    [inst] = m.list_instances(1)
    assert inst == MigInstanceInfo(gpu=1, gi_id=1, profile="2g.12gb", start=2, size=2, ci_ids=(0,), uuid=inst.uuid)


@pytest.mark.parametrize("spec", ["", "H100-80GB", "H100-80GBxtwo", "x2"])
def test_a_bad_fake_spec_is_refused(spec):
    with pytest.raises(ValueError):
        from_spec(spec)


def test_a_spec_can_mix_models_and_mig_modes():
    m = NvmlMig(from_spec("H100-80GBx1,A100-40GBx1@off"))
    assert m.gpu_count() == 2
    assert (m.mig_enabled(0), m.mig_enabled(1)) == (True, False)
    assert m.describe(1)[0] == "NVIDIA A100-40GB"


def test_a_nodes_fake_names_its_gpus_as_topology_discovery_does_and_every_create_gets_a_new_mig_uuid():
    from phalanx_nvmlfake.nvml import gpu_uuid

    fake = from_spec("A100-40GBx2", node="node-a")
    m = NvmlMig(fake)
    assert [fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)) for i in range(2)] == [
        gpu_uuid("node-a", "GPU0"), gpu_uuid("node-a", "GPU1")]
    first = m.create(1, "3g.20gb", 0)
    uuid_1 = m.list_instances(1)[0].uuid
    m.destroy(1, first)
    m.create(1, "3g.20gb", 0)  # the same slot again: a new device, as the driver makes it
    uuid_2 = m.list_instances(1)[0].uuid
    again = NvmlMig(from_spec("A100-40GBx2", node="node-a"))
    again.create(1, "3g.20gb", 0)
    other = NvmlMig(from_spec("A100-40GBx2", node="node-b"))
    other.create(1, "3g.20gb", 0)
    assert uuid_1.startswith("MIG-") and uuid_1 != uuid_2
    assert again.list_instances(1)[0].uuid == uuid_1  # stable within a run: the same node's first create
    assert other.list_instances(1)[0].uuid != uuid_1
