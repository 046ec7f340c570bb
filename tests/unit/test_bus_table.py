"""The bus table (phalanx_proto.subjects) is consistent with itself, and what derives from it —
permissions, credentials, the consumer's address check — says what the table says."""

from __future__ import annotations

import re

import nkeys
import pytest

from phalanx_bus.consumer import misaddressed
from phalanx_bus.credentials import KeySet, decode_jwt_claims, public_key, read_creds_jwt
from phalanx_bus.permissions import Permissions, permissions
from phalanx_cli.main import main
from phalanx_proto import events as E
from phalanx_proto import subjects as S

SAMPLE = {"gang": "default/train", "node": "v100-a", "stream": "PHX_GANG", "consumer": "placement",
          "replica": "placement-7f9c-1234-ab12cd"}


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def sample(channel: S.Channel) -> str:
    return S.render(channel.template, **{k: v for k, v in SAMPLE.items() if "{" + k + "}" in channel.template})


@pytest.mark.parametrize("channel", S.CHANNELS, ids=lambda c: c.id)
def test_each_channel_lies_in_its_stream_and_in_no_other(channel):
    owners = [st.name for st in S.STREAMS if any(matches(p, sample(channel)) for p in st.subjects)]
    assert owners == [channel.stream]
    assert S.channel_of(sample(channel)) == channel


@pytest.mark.parametrize("consumer", S.CONSUMERS, ids=lambda c: c.durable)
def test_each_consumer_filter_selects_exactly_its_channels(consumer):
    filt = S.durable(consumer.durable, "v100-a").filter if "{node}" in consumer.durable else consumer.filter
    selected = sorted(c.id for c in S.CHANNELS if c.stream == consumer.stream and matches(filt, sample(c)))
    assert selected == sorted(consumer.channels)


def test_every_event_kind_travels_on_some_channel_and_every_identity_is_declared():
    assert {E.tag_of(t) for t in E.ALL_EVENTS} - {k for c in S.CHANNELS for k in c.kinds + c.carries} == {
        E.tag_of(E.NodeHeartbeat)}  # heartbeats live in KV phx-heartbeat only
    named = {i for c in S.CHANNELS for i in c.publishers + c.subscribers} | {c.identity for c in S.CONSUMERS} | {
        g.identity for b in S.BUCKETS for g in b.grants}
    assert named <= set(S.IDENTITIES)


def test_only_placement_writes_the_ledger_and_only_the_coordinator_sends_commands():
    writers = {b.name: sorted({g.identity for g in b.grants if g.level == S.WRITE}) for b in S.BUCKETS}
    assert writers[S.KV_LEDGER] == [S.PLACEMENT]
    assert writers[S.KV_GANGS] == writers[S.KV_LEASES] == [S.GANG_COORDINATOR]
    assert writers[S.KV_TOPOLOGY] == writers[S.KV_HEARTBEAT] == [S.TOPOLOGY_DISCOVERY]
    for cid in ("gangPlacement", "gangBinder", "nodeMig", "deadlineSchedule"):
        assert S.CHANNEL[cid].publishers == (S.GANG_COORDINATOR,), cid


def test_a_node_agents_permissions_name_only_its_own_node_and_create_no_consumer():
    assert permissions(S.MIG_MANAGER) == Permissions(
        ("$JS.ACK.PHX_NODE.mig-manager-{{tag(node)}}.>",
         "$JS.API.CONSUMER.INFO.PHX_NODE.mig-manager-{{tag(node)}}",
         "$JS.API.CONSUMER.MSG.NEXT.PHX_NODE.mig-manager-{{tag(node)}}",
         "$JS.API.DIRECT.GET.KV_phx-ledger.$KV.phx-ledger.{{tag(node)}}",
         "$JS.API.DIRECT.GET.KV_phx-mig.$KV.phx-mig.{{tag(node)}}",
         "$JS.API.STREAM.INFO.KV_phx-ledger", "$JS.API.STREAM.INFO.KV_phx-mig",
         "$KV.phx-mig.{{tag(node)}}", "phx.dlq.PHX_NODE.mig-manager-{{tag(node)}}", "phx.node.{{tag(node)}}.reply"),
        ("_INBOX.{{subject()}}.>",))


def test_only_a_durables_creator_may_create_it():
    """A consumer's deliver subject is not checked against its creator's rights: creating a
    durable is the admin's (``phalanx bus init``), and gang-coordinator's for nodes' MIG durables."""
    creators = {i: sorted(s for s in permissions(i).publish if re.match(r"^\$JS\.API\.CONSUMER\.CREATE\.PHX_", s))
                for i in S.IDENTITIES if i != S.ADMIN}
    assert {i: s for i, s in creators.items() if s} == {
        S.GANG_COORDINATOR: ["$JS.API.CONSUMER.CREATE.PHX_NODE.*.phx.node.*.mig"]}


def test_a_subscriber_may_only_listen_to_status_and_topology():
    assert permissions(S.SUBSCRIBER) == Permissions((), ("_INBOX.{{subject()}}.>", "phx.gang.status.>", "phx.topology.>"))


def test_only_admin_reaches_the_jetstream_admin_api():
    admin_api = re.compile(r"^\$JS\.API\.(STREAM\.(CREATE|UPDATE|DELETE|PURGE|MSG\.DELETE)|ACCOUNT|META|SERVER)")
    reaching = {i: [s for s in permissions(i).publish if admin_api.match(s)] for i in S.IDENTITIES if i != S.ADMIN}
    assert {i: s for i, s in reaching.items() if s} == {}


def test_only_cluster_services_may_create_ephemeral_consumers():
    """An ephemeral push consumer's deliver subject is not checked against its creator's
    permissions, so it is a way to publish anywhere: never for node agents or read-only users."""
    creators = sorted(i for i in S.IDENTITIES if any(re.match(r"^\$JS\.API\.CONSUMER\.CREATE\.[^.]+(\.>)?$", s)
                                                       for s in permissions(i).publish))
    assert creators == [S.BINDER, S.GANG_COORDINATOR, S.PLACEMENT]  # (admin may do anything)


def test_a_node_agent_credential_carries_its_nodes_as_tags_and_no_permissions_of_its_own():
    keys = KeySet.generate()
    jwt = keys.user_creds(S.TOPOLOGY_DISCOVERY, ("v100-a", "node.with.dots")).split("\n")[1]
    header, payload, signature = jwt.split(".")
    claims = decode_jwt_claims(jwt)
    assert claims["iss"] == public_key(keys.signing[S.TOPOLOGY_DISCOVERY])
    assert claims["nats"] == {"type": "user", "version": 2, "issuer_account": public_key(keys.account),
                              "tags": ["node:v100-a", "node:node_with_dots"]}
    import base64
    sig = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    assert nkeys.from_seed(keys.signing[S.TOPOLOGY_DISCOVERY].encode()).verify(f"{header}.{payload}".encode(), sig)


def test_the_account_jwt_scopes_each_signing_key_to_its_identitys_permissions():
    keys = KeySet.generate()
    scopes = {s["role"]: s for s in decode_jwt_claims(keys.account_jwt())["nats"]["signing_keys"]}
    assert sorted(scopes) == sorted(set(S.IDENTITIES) - {S.ADMIN})
    for name, scope in scopes.items():
        perms = permissions(name)
        pub = {"allow": list(perms.publish)} if perms.publish else {"deny": [">"]}
        assert (scope["key"], scope["template"]["pub"], scope["template"]["sub"]) == (
            public_key(keys.signing[name]), pub, {"allow": list(perms.subscribe)})


def test_rotating_a_signing_key_changes_only_that_key(tmp_path):
    keys = KeySet.generate()
    rotated = keys.rotate(S.PLACEMENT)
    changed = {k for k in keys.signing if keys.signing[k] != rotated.signing[k]}
    assert changed == {S.PLACEMENT} and rotated.account == keys.account
    path = tmp_path / "p.creds"
    path.write_text(keys.user_creds(S.PLACEMENT))
    assert decode_jwt_claims(read_creds_jwt(path))["name"] == S.PLACEMENT


@pytest.mark.parametrize(("subject", "event", "why"), [
    ("phx.gang.coord.bound.r1", E.Reserved(gang_id="default/g"), "kind 'gang.reserved' is not allowed"),
    ("phx.gang.coord.binder.default.g", E.BindsDone(gang_id="default/g"), "is no channel"),
    ("phx.node.v100-a.reply", E.MigReady(node="v100-b", gang_id="default/g", pod=E.PodRef(namespace="d", name="p"),
                                         instance_uuid="u"), "node 'v100-b' of the event is not the node"),
    ("phx.gang.placement.default.other", E.PlaceRequested(gang_id="default/g"), "gang 'default/g'"),
    ("phx.gang.placement.default.g", E.PlaceRequested(gang_id="default/g"), ""),
])
def test_the_consumer_refuses_an_event_its_subject_does_not_allow(subject, event, why):
    got = misaddressed(subject, event)
    assert (why in got and bool(got) == bool(why)) if why else got == ""


def test_the_permission_table_in_docs_security_md_is_the_generated_one():
    assert main(["bus", "permissions", "--check"]) == 0


GANG_IDS_THAT_MUST_NOT_SHARE_A_KEY = [
    "ml/a.b", "ml/a_b", "ml/a-b", "ml/a:b", "ml/a/b", "ml/a_2eb", "ml/a_5fb", "ml/", "ml/_",
    "ml/JobSet:train", "ml/JobSet_train", "ml/JobSet.train", "ml/trän", "ml/tr_c3_a4n", "ml.x/y", "ml/x.y",
]


def test_two_gang_ids_never_share_a_key_and_every_key_is_a_valid_kv_key_of_two_tokens():
    keys = [S.gang_key(g) for g in GANG_IDS_THAT_MUST_NOT_SHARE_A_KEY]
    assert len(set(keys)) == len(keys), sorted(zip(keys, GANG_IDS_THAT_MUST_NOT_SHARE_A_KEY, strict=True))
    for key in keys:
        assert re.fullmatch(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+", key), key


@pytest.mark.parametrize(("gang_id", "key"), [
    ("default/whole-card-demo", "default.whole-card-demo"),
    ("ml/JobSet:train", "ml.JobSet_3atrain"),
    ("ml/a.b", "ml.a_2eb"),
    ("ml/a_b", "ml.a_5fb"),
    ("ml/", "ml._"),
])
def test_a_gang_key_keeps_dns_names_as_they_are_and_escapes_every_other_byte(gang_id, key):
    assert S.gang_key(gang_id) == key
