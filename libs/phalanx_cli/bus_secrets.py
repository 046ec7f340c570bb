"""``phalanx bus kube-secrets``: make the bus's keys, credentials and TLS material as Kubernetes
Secrets, or delete them. The Helm chart's hook Jobs run it (deploy/helm/phalanx, templates
``credentials.yaml``): before install and every upgrade, and after uninstall with ``--delete``.

What it writes (the names deploy/k8s and the chart mount):

* ``phalanx-nats-auth`` (``auth.conf``): the nats-server's operator/resolver block;
* ``phalanx-nats-<identity>`` (``creds``) for admin, gang-coordinator, placement and binder;
* ``phalanx-nats-keys`` (``keys.json``): the seeds, to mint node agents' credentials
  (``phalanx bus creds topology-discovery --node N --keys keys.json``) and nothing else; the
  admin may move them offline and delete this Secret, which does not count as missing;
* ``phalanx-nats-tls`` (``tls.crt``, ``tls.key``, ``ca.crt``, type ``kubernetes.io/tls``) unless
  ``--no-tls`` (cert-manager or the admin's own CA writes it then).

It is idempotent: when every Secret is there and carries the requested ``--rotation`` value
(annotation ``phalanx.io/rotation``), nothing changes. A missing Secret or another rotation
value makes a whole new set (new operator, account, signing keys, CA), since credentials are
only valid together with the ``auth.conf`` that trusts them. Only Secret names and what was done
to them are printed, never a value.
"""

from __future__ import annotations

import argparse
import sys

import anyio

SECRET_PREFIX = "phalanx-nats-"
CLUSTER_IDENTITIES = ("admin", "gang-coordinator", "placement", "binder")
TLS_SECRET = "phalanx-nats-tls"
KEYS_SECRET = "phalanx-nats-keys"
ROTATION = "phalanx.io/rotation"
MANAGED_BY = "phalanx-bus-kube-secrets"


def register(cmds) -> None:
    p = cmds.add_parser("kube-secrets", help="write (or --delete) the bus's Kubernetes Secrets (Helm hook)",
                        description="Make the bus keys, credentials and TLS material as Kubernetes Secrets "
                                    "in NAMESPACE, or delete them. Prints Secret names only.")
    p.add_argument("--namespace", required=True, help="namespace of the Secrets and of the nats Service")
    p.add_argument("--release", default="phalanx", help="label app.kubernetes.io/instance of the Secrets")
    p.add_argument("--rotation", default="", help="a new value makes a whole new set of keys and certificates")
    p.add_argument("--no-tls", dest="tls", action="store_false",
                   help=f"leave {TLS_SECRET} alone (cert-manager or your own CA writes it)")
    p.add_argument("--tls-days", type=int, default=365, help="validity of the CA and server certificate")
    p.add_argument("--nats-service", default="nats", help="the nats client Service (its headless one is "
                                                          "NAME-headless)")
    p.add_argument("--cluster-domain", default="cluster.local")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the in-cluster ServiceAccount")
    p.add_argument("--delete", action="store_true", help="delete the Secrets this command made")
    p.set_defaults(func=run)


def secret_names(tls: bool) -> list[str]:
    return [f"{SECRET_PREFIX}{n}" for n in ("auth", "keys", *CLUSTER_IDENTITIES)] + ([TLS_SECRET] if tls else [])


def dns_names(namespace: str, service: str, domain: str) -> tuple[str, ...]:
    """What clients dial (``<service>.<ns>.svc``) and what routes dial (``<pod>.<service>-headless
    .<ns>.svc``), short and fully qualified."""
    names = []
    for suffix in (f"{namespace}.svc", f"{namespace}.svc.{domain}"):
        names += [f"{service}.{suffix}", f"*.{service}-headless.{suffix}"]
    return (*names, service, f"{service}.{namespace}")


def bundle(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, bytes]]]:
    """Secret name -> (type, data): a fresh, consistent set."""
    from phalanx_bus.credentials import KeySet
    from phalanx_bus.tlsca import issue

    keys = KeySet.generate()
    out = {f"{SECRET_PREFIX}auth": ("Opaque", {"auth.conf": keys.server_config().encode()}),
           f"{SECRET_PREFIX}keys": ("Opaque", {"keys.json": keys.to_json().encode()})}
    for identity in CLUSTER_IDENTITIES:
        out[f"{SECRET_PREFIX}{identity}"] = ("Opaque", {"creds": keys.user_creds(identity).encode()})
    if args.tls:
        pem = issue(dns_names(args.namespace, args.nats_service, args.cluster_domain), args.tls_days, org="Phalanx")
        out[TLS_SECRET] = ("kubernetes.io/tls", {"tls.crt": pem.cert, "tls.key": pem.key, "ca.crt": pem.ca})
    return out


async def sync(store, args: argparse.Namespace) -> list[tuple[str, str]]:
    """Make the Secrets current; (name, what was done) for each."""
    from phalanx_kube.secrets import Secret

    names = [n for n in secret_names(args.tls) if n != KEYS_SECRET]  # the seeds may have been moved offline
    current = {n: await store.get(n) for n in names}
    if all(s is not None and s.annotations.get(ROTATION) == args.rotation for s in current.values()):
        return [(n, "kept") for n in names]
    labels = {"app.kubernetes.io/part-of": "phalanx", "app.kubernetes.io/managed-by": MANAGED_BY,
              "app.kubernetes.io/instance": args.release}
    done = []
    for name, (kind, data) in bundle(args).items():
        done.append((name, await store.put(Secret(name, data, labels, {ROTATION: args.rotation}, kind))))
    return done


async def delete(store, args: argparse.Namespace) -> list[tuple[str, str]]:
    """Delete the Secrets this command made (label ``managed-by``); others are left alone."""
    done = []
    for name in secret_names(args.tls):
        secret = await store.get(name)
        if secret is None:
            done.append((name, "absent"))
        elif secret.labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
            done.append((name, "not ours, kept"))
        else:
            await store.delete(name)
            done.append((name, "deleted"))
    return done


def run(args: argparse.Namespace) -> int:
    from phalanx_kube.secrets import SecretApiError, SecretStore

    async def body() -> list[tuple[str, str]]:
        store = await SecretStore.open(args.namespace, args.kubeconfig)
        try:
            with anyio.fail_after(120):
                return await (delete if args.delete else sync)(store, args)
        finally:
            await store.close()

    try:
        done = anyio.run(body)
    except (SecretApiError, TimeoutError, OSError) as e:
        print(f"phalanx bus kube-secrets: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - no kubeconfig, no in-cluster account: say so, no traceback
        print(f"phalanx bus kube-secrets: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for name, what in done:
        print(f"phalanx bus kube-secrets: {args.namespace}/{name} {what}", file=sys.stderr)
    return 0
