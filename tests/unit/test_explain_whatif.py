"""``phalanx explain`` shows the counterfactual answers a gang record carries (and nothing
when it carries none, as every record does until placement writes them)."""

from __future__ import annotations

from types import SimpleNamespace

from phalanx_cli.cmd_explain import render, whatif_doc
from phalanx_proto.state import GangState
from phalanx_proto.whatif import Answer, Holder, WhatIf

ANSWERS = WhatIf(answers=(
    Answer(probe="queue-limit", text="needs 2 more GPUs of headroom under queue team's limit 8, and room in the cluster",
           starts=False, queue="team", lacking_gpus=2.0),
    Answer(probe="wait", text="would start if 3 GPUs free in network-pod p1 (held by gangs a/train-7, b/exp-2)", gpus=3,
           holders=(Holder(gang_id="a/train-7", gpus=2), Holder(gang_id="b/exp-2", gpus=1)))), cut=("fewer",))


def report(whatif) -> dict:
    return {"pod": {"namespace": "default", "name": "w-0", "uid": "u", "scheduler_name": "phalanx", "node": None},
            "status": "pending", "managed": True, "gang": None, "reason": "0/4 nodes are available: 4 insufficient "
            "free GPUs.", "assignment": None, "condition": None, "trace_id": None, "trace_url": None, "events": [],
            "unreadable_records": [], "whatif": whatif}


def test_a_record_carrying_answers_is_shown_under_what_if():
    doc = whatif_doc(SimpleNamespace(whatif=ANSWERS))
    assert doc["answers"][1]["holders"] == [{"gang_id": "a/train-7", "gpus": 2}, {"gang_id": "b/exp-2", "gpus": 1}]
    lines = render(report(doc)).splitlines()
    assert lines[4:8] == [
        "What if:",
        "  needs 2 more GPUs of headroom under queue team's limit 8, and room in the cluster (not enough alone)",
        "  would start if 3 GPUs free in network-pod p1 (held by gangs a/train-7, b/exp-2)",
        "  (out of time before: fewer)"]


def test_a_record_without_answers_shows_no_what_if():
    assert whatif_doc(GangState(gang_id="default/w")) is None
    assert whatif_doc(SimpleNamespace(whatif=WhatIf())) is None
    assert "What if" not in render(report(None))
