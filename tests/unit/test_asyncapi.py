"""proto/asyncapi.yaml: generated from proto/, checked in, and consistent with itself and the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from phalanx_bus.bus import destination_template
from phalanx_cli import cmd_asyncapi
from phalanx_cli.main import main
from phalanx_proto import events as E
from phalanx_proto import subjects as S

PROTO = Path(cmd_asyncapi.DEFAULT_PATH).parent
DOC = yaml.safe_load(cmd_asyncapi.DEFAULT_PATH.read_text())


def test_the_checked_in_document_is_what_the_generator_writes():
    assert cmd_asyncapi.DEFAULT_PATH.read_text() == cmd_asyncapi.render(), (
        "proto/asyncapi.yaml drifted from proto/: run `phalanx asyncapi` and commit the result")
    assert main(["asyncapi", "--check"]) == 0


def test_check_fails_on_drift(tmp_path, capsys):
    stale = tmp_path / "asyncapi.yaml"
    stale.write_text(cmd_asyncapi.render().replace("3.0.0", "2.6.0", 1))
    assert main(["asyncapi", "--check", "--out", str(stale)]) == 1
    assert "drift" in capsys.readouterr().err


def test_it_is_an_asyncapi_3_document_with_channels_operations_and_messages():
    assert DOC["asyncapi"] == "3.0.0"
    assert DOC["info"]["title"] and DOC["info"]["version"]
    assert DOC["servers"]["local"]["protocol"] == "nats"
    for cid, ch in DOC["channels"].items():
        assert ch["address"] and ch["messages"], cid
        for param in re.findall(r"{(\w+)}", ch["address"]):
            assert param in ch.get("parameters", {}), (cid, param)
    for oid, op in DOC["operations"].items():
        assert op["action"] in ("send", "receive"), oid
        cid = op["channel"]["$ref"].removeprefix("#/channels/")
        assert cid in DOC["channels"], oid
        for m in op["messages"]:
            assert m["$ref"].startswith(f"#/channels/{cid}/messages/"), (oid, m)


def _refs(node, path="$"):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield path, v
            else:
                yield from _refs(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _refs(v, f"{path}[{i}]")


def _resolve(pointer: str):
    node = DOC
    for part in pointer.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_every_reference_resolves_inside_the_document_or_to_a_checked_in_schema():
    refs = list(_refs(DOC))
    assert refs
    for where, ref in refs:
        if ref.startswith("#/"):
            _resolve(ref)  # KeyError names the broken pointer
        else:
            assert (PROTO / ref).is_file(), f"{where}: {ref} is not a file under proto/"


def test_every_wire_event_is_a_message_on_a_channel():
    on_channels = {m for ch in DOC["channels"].values() for m in ch["messages"]}
    carried = {ref["$ref"].rsplit("/", 1)[-1] for ch in DOC["channels"].values()
               for ref in ch.get("x-phalanx-carries", {}).get("messages", ())}
    for t in E.ALL_EVENTS:
        tag = E.tag_of(t)
        assert DOC["components"]["messages"][tag]["payload"] == {"$ref": f"schema/{tag}.json"}
        assert tag in on_channels or tag in carried or f"kv.{t.__name__}" in on_channels, f"{tag} is on no channel"


@pytest.mark.parametrize("subject", [
    S.placement_subject("default/train"), S.binder_subject("default/train"), S.placement_answers_subject("replica-1"),
    S.binder_answers_subject("replica-1"), S.placement_batch_subject("replica-1"), S.binder_batch_subject("replica-1"),
    S.status_subject("default/train"), S.topology_subject("v100-a"), S.mig_subject("v100-a"),
    S.node_reply_subject("v100-a"), S.deadline_schedule_subject("default/train"),
    S.deadline_fired_subject("default/train"),
])
def test_span_destination_templates_are_the_channel_addresses(subject):
    """Traces name a subject by ``messaging.destination.template``; it must be the channel address
    a subscriber finds in the contract."""
    addresses = {ch["address"] for ch in DOC["channels"].values()}
    assert destination_template(subject) in addresses
