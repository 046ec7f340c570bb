"""phalanx_kube.objtable: the ObjectEvents a watch of raw objects (the DRA objects) yields after a
(re-)list and for each watch event, on both adapters."""

from __future__ import annotations

from phalanx_kube.objtable import ObjectTable


def obj(name: str, rv: str, uid: str = "", namespace: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "resourceVersion": rv}}


def kinds(events) -> list[tuple[str, str, str]]:
    return [(e.type, e.name, e.obj["metadata"]["uid"]) for e in events]


def test_a_relist_reports_what_changed_while_the_watch_was_away():
    table = ObjectTable()
    assert kinds(table.relisted([obj("b", "1"), obj("a", "1")])) == [("ADDED", "a", "uid-a"), ("ADDED", "b", "uid-b")]
    got = table.relisted([obj("a", "1"), obj("b", "2"), obj("c", "1")])
    assert kinds(got) == [("MODIFIED", "b", "uid-b"), ("ADDED", "c", "uid-c")]
    got = table.relisted([obj("a", "3", uid="new-a"), obj("c", "1")])
    assert kinds(got) == [("DELETED", "a", "uid-a"), ("DELETED", "b", "uid-b"), ("ADDED", "a", "new-a")]


def test_a_watch_event_for_a_recreated_name_is_the_old_ones_deletion_then_the_new_one():
    table = ObjectTable()
    table.relisted([obj("claim", "1", namespace="ml")])
    assert kinds(table.watched("MODIFIED", obj("claim", "2", namespace="ml"))) == [("MODIFIED", "claim", "uid-claim")]
    assert kinds(table.watched("MODIFIED", obj("claim", "3", uid="u2", namespace="ml"))) == [
        ("DELETED", "claim", "uid-claim"), ("ADDED", "claim", "u2")]
    assert kinds(table.watched("ADDED", obj("claim", "1", namespace="other"))) == [("ADDED", "claim", "uid-claim")]
    assert kinds(table.watched("DELETED", obj("claim", "4", uid="u2", namespace="ml"))) == [("DELETED", "claim", "u2")]
    assert list(table.known) == [("other", "claim")]
