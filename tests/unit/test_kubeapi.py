"""The contract on Kubernetes objects (phalanx_proto.kubeapi): the assignment annotation's one
codec, which binder writes and the reconciler and the device plugin read, and the fence."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from phalanx_proto.events import Assignment, PodRef, encoder
from phalanx_proto.kubeapi import (
    Fence,
    FenceEntry,
    assignment_digest,
    decode_assignment,
    decode_fence,
    encode_assignment,
    encode_fence,
)

A = Assignment(pod=PodRef(namespace="default", name="w-0", uid="u0"), node="n1", gpus=(0, 1))


def test_the_annotation_is_the_assignments_wire_json_and_reads_back_as_the_same_value():
    text = encode_assignment(A)
    assert text == encoder.encode(A).decode()
    assert decode_assignment(text) == A
    assert assignment_digest(text) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("text", ["not json", '{"pod": 1}', "[" * 100_000], ids=["not JSON", "not an assignment",
                                                                                  "nested too deeply"])
def test_an_annotation_that_is_not_an_assignment_is_a_decode_error_never_a_crash(text):
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_assignment(text)


def test_a_fence_reads_back_as_written():
    e = FenceEntry(uid="u0", namespace="default", name="w-0", digest=assignment_digest("x"), expires=5.0)
    fence = Fence(node="n1", pods=(e,))
    assert decode_fence(encode_fence(fence)) == fence and fence.entry("u0") == e and fence.entry("u1") is None
