"""``phalanx explain`` shows a pod's ResourceClaims: allocated to which devices and reserved for
whom, or why there is nothing to show (docs/dra.md)."""

from __future__ import annotations

from phalanx_cli.cmd_explain import claims_doc, render

POD = {"metadata": {"namespace": "team", "name": "w-0"},
       "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "quad"},
                                   {"name": "nic", "resourceClaimName": "shared-nic"},
                                   {"name": "later", "resourceClaimTemplateName": "one"}]},
       "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "w-0-gpus-x7"}]}}

ALLOCATED = {"metadata": {"namespace": "team", "name": "w-0-gpus-x7", "uid": "c1"},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}"} for i in range(2)]}},
                 "reservedFor": [{"resource": "pods", "name": "w-0", "uid": "p1"}]}}


def test_each_claim_says_its_devices_and_pods_or_why_there_are_none():
    assert claims_doc(POD, {"w-0-gpus-x7": ALLOCATED, "shared-nic": None}) == [
        {"name": "gpus", "claim": "w-0-gpus-x7", "state": "allocated", "detail": "", "reserved_for": ["pods/w-0"],
         "devices": [{"request": "gpu", "device": "gpu.nvidia.com/n1/gpu-0"},
                     {"request": "gpu", "device": "gpu.nvidia.com/n1/gpu-1"}]},
        {"name": "nic", "claim": "shared-nic", "state": "absent", "detail": "no such ResourceClaim"},
        {"name": "later", "claim": None, "state": "not created yet",
         "detail": 'pod "team/w-0": ResourceClaim not created yet'},
    ]


def test_an_unallocated_claim_and_the_claim_made_for_extended_resources_are_listed():
    pod = {"metadata": {"namespace": "team", "name": "p"}, "spec": {},
           "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-abc"}}}
    claim = {"metadata": {"namespace": "team", "name": "p-extended-resources-abc", "uid": "c2"}, "status": {}}
    assert claims_doc(pod, {"p-extended-resources-abc": claim}) == [
        {"name": "(extended resources)", "claim": "p-extended-resources-abc", "state": "unallocated", "detail": "",
         "reserved_for": []}]


def test_a_pod_without_claims_has_none_and_a_broken_entry_names_its_field_and_rule():
    assert claims_doc({"metadata": {}, "spec": {}}, {}) is None
    bad = {"metadata": {"namespace": "team", "name": "p"},
           "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}]}}
    (doc,) = claims_doc(bad, {})
    assert doc["state"] == "invalid"
    assert "spec.resourceClaims[0]" in doc["detail"] and "exactly one of resourceClaimName" in doc["detail"]


def test_the_text_form_lists_the_claims_under_their_own_heading():
    report = {"pod": {"namespace": "team", "name": "w-0", "uid": "p1", "scheduler_name": "phalanx", "node": "n1"},
              "status": "bound", "managed": True, "gang": None, "reason": "", "assignment": None, "condition": None,
              "trace_id": None, "trace_url": None, "events": [], "unreadable_records": [], "whatif": None,
              "preempting": None, "claims": claims_doc(POD, {"w-0-gpus-x7": ALLOCATED})}
    lines = render(report).splitlines()
    at = lines.index("Claims:")
    assert lines[at + 1:at + 4] == [
        "  gpus (claim w-0-gpus-x7): allocated to gpu.nvidia.com/n1/gpu-0 (gpu), gpu.nvidia.com/n1/gpu-1 (gpu); "
        "reserved for pods/w-0",
        "  nic (claim shared-nic): absent — no such ResourceClaim",
        '  later: not created yet — pod "team/w-0": ResourceClaim not created yet',
    ]
