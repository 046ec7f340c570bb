"""Each identity's NATS publish/subscribe permissions, derived from the bus table in
``phalanx_proto.subjects`` (nothing here names a Phalanx subject).

What a JetStream client needs, and therefore what a grant becomes:

* publish on a channel: the subject (a JetStream publish is a request; its ack comes back to
  the identity's own inbox);
* a durable pull consumer: read its info, pull from it, ack its messages, and dead-letter to
  its own ``phx.dlq.<stream>.<durable>``. Only its *creator* (``Consumer.creator``: the admin,
  or gang-coordinator for a node's MIG consumer) may create it, through the subject that names
  the durable and the filter (the server checks both against the body): the server does not
  check a consumer's deliver subject, so whoever may create a consumer may make a push consumer
  publish stored messages on any subject, which no node agent may do;
* read a KV bucket: the stream info of ``KV_<bucket>`` and direct gets; a per-key grant allows
  only the subject form of a direct get (``$JS.API.DIRECT.GET.KV_b.$KV.b.<key>``), never the
  form whose body names the key;
* watch: also ephemeral ordered consumers on the bucket (push, flow-controlled). Their deliver
  subject is in the request body and the server does not check it against the creator's
  permissions, so only trusted cluster services get WATCH (docs/security.md);
* write: publish on ``$KV.<bucket>.<key>`` (put, create, update, delete and the atomic batch
  are all publishes there);
* every identity but ``admin`` subscribes only to its own inbox, ``_INBOX.<its user key>.>``
  (``phalanx_bus.Bus.connect`` sets that prefix), so nobody reads another identity's replies.

``{node}`` in a per-node identity's grant becomes ``{{tag(node)}}``: the server fills it from
the node tags of the user JWT (one subject per tag), so a node agent's credential reaches its
own node's subjects and keys only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from phalanx_proto import subjects as S

INBOX_TEMPLATE = "_INBOX.{{subject()}}.>"
NODE_TEMPLATE = "{{tag(node)}}"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def _fill(template: str, per_node: bool, *, subscribe: bool = False) -> str:
    """A template as a permission subject. A subscription grant ends in ``>`` where the
    template ends in a placeholder, so ``phx.gang.status.>`` (the same subjects as
    ``phx.gang.status.*.*``) is a subscription the identity may make."""
    if subscribe and not per_node:
        template = re.sub(r"\{\w+\}$", ">", template)
    filled = template.replace("{gang}", "*.*").replace("{node}", NODE_TEMPLATE if per_node else "*")
    return re.sub(r"\{\w+\}", "*", filled)  # any other placeholder ({replica}) is one token


def _bucket_subjects(bucket: S.Bucket, grant: S.Grant, per_node: bool) -> set[str]:
    stream, keys = f"KV_{bucket.name}", _fill(grant.keys, per_node)
    out = {f"$JS.API.STREAM.INFO.{stream}"}
    if grant.level == S.INFO:
        return out
    out.add(f"$JS.API.DIRECT.GET.{stream}.$KV.{bucket.name}.{keys}")
    if grant.keys == ">":
        out |= {f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}"}
    if grant.level == S.WATCH:
        out |= {f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.DELETE.{stream}.>", f"$JS.API.CONSUMER.INFO.{stream}.>", f"$JS.FC.{stream}.>"}
    if grant.level == S.WRITE:
        out.add(f"$KV.{bucket.name}.{keys}")
    return out


def _consumer_subjects(c: S.Consumer, per_node: bool) -> set[str]:
    """What the consuming identity needs: bind (info), pull, ack, dead-letter."""
    name = _fill(c.durable, per_node)
    return {f"$JS.API.CONSUMER.INFO.{c.stream}.{name}", f"$JS.API.CONSUMER.MSG.NEXT.{c.stream}.{name}",
            f"$JS.ACK.{c.stream}.{name}.>",
            S.CHANNEL["deadLetter"].template.replace("{stream}", c.stream).replace("{consumer}", name)}


def _creator_subjects(c: S.Consumer) -> set[str]:
    """What the creator needs: look the durable up and create it with its filter. A per-node
    durable's name is one token (``mig-manager-<node>``), so the creator's grant names any
    durable of that stream, with the filter's node left open the same way."""
    name = "*" if "{node}" in c.durable else c.durable
    filt = c.filter.replace("{node}", "*")
    return {f"$JS.API.CONSUMER.INFO.{c.stream}.{name}", f"$JS.API.CONSUMER.CREATE.{c.stream}.{name}.{filt}"}


def permissions(identity: str) -> Permissions:
    """The publish and subscribe allow-lists of ``identity`` (a name in ``IDENTITIES``)."""
    if identity == S.ADMIN:
        return Permissions((">",), (">",))
    ident = S.IDENTITIES[identity]
    names = {identity, *ident.includes}
    pub: set[str] = set()
    sub: set[str] = {INBOX_TEMPLATE}
    for ch in S.CHANNELS:
        if names & set(ch.publishers):
            pub.add(_fill(ch.template, ident.per_node))
        if names & set(ch.subscribers):
            sub.add(_fill(ch.template, ident.per_node, subscribe=True))
    for c in S.CONSUMERS:
        if c.identity in names:
            pub |= _consumer_subjects(c, ident.per_node)
        if c.creator in names:
            pub |= _creator_subjects(c)
    for b in S.BUCKETS:
        for g in b.grants:
            if g.identity in names:
                pub |= _bucket_subjects(b, g, ident.per_node)
    pub |= {f"$JS.API.{api}" for api in S.EXTRA_API.get(identity, ())}
    return Permissions(tuple(sorted(pub)), tuple(sorted(sub)))


def _keys(grant: S.Grant) -> str:
    return "all keys" if grant.keys == ">" else "key " + grant.keys.replace("{node}", "<own node>")


def table_markdown() -> str:
    """The permission table of docs/security.md, in words, one row per identity."""
    rows = ["| identity | publishes | consumes (durable: filter) | subscribes | KV access |", "|---|---|---|---|---|"]
    for name, ident in S.IDENTITIES.items():
        if name == S.ADMIN:
            rows.append(f"| `{name}` | everything | everything, and creates every durable but the nodes' MIG "
                        "consumers | everything | everything, and the JetStream admin API (streams, buckets, purge, "
                        "delete) |")
            continue
        own = (lambda t: t.replace("{node}", "<own node>")) if ident.per_node else (lambda t: t)
        pubs = [f"`{own(c.template)}`" for c in S.CHANNELS if name in c.publishers]
        subs = [f"`{own(c.template)}`" for c in S.CHANNELS if name in c.subscribers]
        cons = [f"`{own(c.durable)}`: `{own(c.filter)}`" for c in S.CONSUMERS if c.identity == name]
        cons += [f"creates `{c.durable}`" for c in S.CONSUMERS if c.creator == name]
        kv = [f"{b.name}: {g.level} ({_keys(g)})" for b in S.BUCKETS for g in b.grants if g.identity == name]
        extra = [f"`$JS.API.{a}`" for a in S.EXTRA_API.get(name, ())]
        rows.append(f"| `{name}`{' (per node)' if ident.per_node else ''} | {', '.join(pubs + extra) or '-'} | "
                    f"{', '.join(cons) or '-'} | {', '.join(subs) or '-'} (+ own inbox) | {'; '.join(kv) or '-'} |")
    return "\n".join(rows) + "\n"
