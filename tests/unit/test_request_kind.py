"""One vocabulary for what a member asks for and what a reservation holds (``RequestKind``)."""

from __future__ import annotations

import pytest

from phalanx_proto.events import Assignment, MemberSpec, PodRef, RequestKind
from phalanx_telemetry.allocation import mode_of

POD = PodRef(namespace="ns", name="p")


@pytest.mark.parametrize(("spec", "kind"), [
    pytest.param(MemberSpec(pod=POD, gpus=2), RequestKind.WHOLE, id="a member that counts GPUs asks for whole GPUs"),
    pytest.param(MemberSpec(pod=POD, gpus=1, core_pct=30), RequestKind.TDM, id="a core percent is a TDM share"),
    pytest.param(MemberSpec(pod=POD, gpus=1, memory_mib=4096), RequestKind.TDM, id="GPU memory alone is a TDM share"),
    pytest.param(MemberSpec(pod=POD, gpus=1, mig_slices=3, memory_mib=20480), RequestKind.MIG,
                 id="MIG slices win over the memory that comes with them"),
    pytest.param(MemberSpec(pod=POD), RequestKind.NONE, id="a member without GPUs asks for none"),
])
def test_a_members_kind_comes_from_its_fields(spec: MemberSpec, kind: RequestKind) -> None:
    assert spec.kind is kind


@pytest.mark.parametrize(("assignment", "kind", "label"), [
    pytest.param(Assignment(pod=POD, node="n", gpus=(0, 1)), RequestKind.WHOLE, "whole", id="whole GPUs"),
    pytest.param(Assignment(pod=POD, node="n", gpus=(3,), core_pct=50, memory_mib=1024), RequestKind.TDM, "shared",
                 id="a TDM share is the metrics' shared mode"),
    pytest.param(Assignment(pod=POD, node="n", gpus=(0,), memory_mib=20480, mig_profile="3g.20gb", mig_start=4),
                 RequestKind.MIG, "mig", id="a MIG instance"),
    pytest.param(Assignment(pod=POD, node="n"), RequestKind.NONE, "whole", id="no GPU at all"),
])
def test_a_reservations_kind_is_the_same_vocabulary(assignment: Assignment, kind: RequestKind, label: str) -> None:
    assert (assignment.kind, mode_of(assignment)) == (kind, label)
