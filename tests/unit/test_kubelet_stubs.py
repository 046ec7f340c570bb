"""The kubelet API stubs are the exact output of the pinned generator on the checked-in protos,
and the protos are the upstream files unchanged (like ``phalanx schema --check`` for events)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from phalanx_deviceplugin import codegen


@pytest.mark.parametrize("proto", codegen.PROTOS)
def test_the_copied_kubelet_proto_is_the_upstream_file_named_in_its_header(proto):
    declared, actual = codegen.upstream_body(codegen.PROTO_ROOT / proto)
    assert len(declared) == 64
    assert actual == declared


def test_the_checked_in_stubs_are_what_the_generator_writes_today():
    with tempfile.TemporaryDirectory() as tmp:
        files = codegen.generate(Path(tmp))
        assert len(files) == 9  # 4 stubs, 5 package markers
        drift = [str(rel) for rel in files
                 if (Path(tmp) / rel).read_bytes() != (codegen.LIBS / rel).read_bytes()]
    assert drift == [], f"regenerate with `python -m phalanx_deviceplugin.codegen`: {drift}"


def test_the_stubs_name_the_kubelet_services_and_api_version():
    from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
    from phalanx_deviceplugin.kubelet.podresources.v1 import api_pb2 as pr

    assert [s.full_name for s in dp.DESCRIPTOR.services_by_name.values()] == ["v1beta1.Registration",
                                                                             "v1beta1.DevicePlugin"]
    assert [s.full_name for s in pr.DESCRIPTOR.services_by_name.values()] == ["v1.PodResourcesLister"]
