"""``phalanx explain`` names the victims a pending gang's nominations in ``phx-ledger`` hold
GPUs for (docs/preemption.md), and nothing for nominations of other gangs or expired ones."""

from __future__ import annotations

import time

from phalanx_cli.cmd_explain import preempting_doc, render
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.state import NodeLedger, Nomination


def nomination(gang: str, node: str, victims: dict[str, str], expires_at: float) -> Nomination:
    pod = PodRef(namespace="default", name=f"{gang.split('/')[1]}-0", uid="u")
    return Nomination(gang_id=gang, attempt=2, assignment=Assignment(pod=pod, node=node, gpus=(0, 1)),
                      victims=victims, expires_at=expires_at)


LEDGERS = [
    NodeLedger(node="n1", nominations={"a": nomination("default/hi", "n1", {"team-b/lo-7": "priority"}, 200.0),
                                       "b": nomination("default/other", "n1", {"x/y": "priority"}, 200.0)}),
    NodeLedger(node="n3", nominations={"c": nomination("default/hi", "n3", {"team-a/exp-2": "reclaim"}, 150.0)}),
    NodeLedger(node="n4", nominations={"d": nomination("default/hi", "n4", {"old/gone": "priority"}, 90.0)}),
]


def test_the_victims_of_the_gangs_nominations_in_force_are_listed_with_their_rules_and_nodes():
    assert preempting_doc(LEDGERS, "default/hi", now=100.0) == {
        "victims": [{"gang": "team-a/exp-2", "rule": "reclaim"}, {"gang": "team-b/lo-7", "rule": "priority"}],
        "nodes": ["n1", "n3"], "until": 150.0}


def test_a_gang_without_a_nomination_in_force_has_none():
    assert preempting_doc(LEDGERS, "default/hi", now=250.0) is None
    assert preempting_doc(LEDGERS, "default/nobody", now=100.0) is None
    assert preempting_doc([NodeLedger(node="n9")], "default/hi", now=100.0) is None


def test_the_text_form_says_whom_it_preempts_and_where_the_gpus_are_kept():
    doc = preempting_doc(LEDGERS, "default/hi", now=100.0)
    report = {"pod": {"namespace": "default", "name": "hi-0", "uid": "u", "scheduler_name": "phalanx", "node": None},
              "status": "pending", "managed": True, "gang": None, "reason": "preempting team-b/lo-7 …",
              "assignment": None, "condition": None, "trace_id": None, "trace_url": None, "events": [],
              "unreadable_records": [], "whatif": None, "preempting": doc}
    line = next(x for x in render(report).splitlines() if x.startswith("Preempting:"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(150.0))
    assert line == f"Preempting:  team-a/exp-2 (reclaim), team-b/lo-7 (priority); GPUs kept on n1, n3 until {stamp}"
