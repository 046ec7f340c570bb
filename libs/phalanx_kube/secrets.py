"""Kubernetes Secrets for the bus credentials: read, write whole, delete.

Used by ``phalanx bus kube-secrets`` (the Helm chart's credentials hook Job). It is part of the
Kubernetes adapter package because it imports ``kubernetes_asyncio`` (import-linter contract).
Values are bytes in and bytes out; nothing here logs or prints a value.

RBAC this needs in the namespace: secrets ``get``, ``create``, ``update`` and ``delete`` (the
chart's hook Role grants ``create`` on secrets and the rest on the named Secrets only).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field

import msgspec
from kubernetes_asyncio import client, config

REQUEST_TIMEOUT_S = 30.0


class SecretApiError(RuntimeError):
    """The API server refused or failed a Secret request; the message names the Secret."""

    def __init__(self, status: int, what: str, message: str) -> None:
        self.status = status
        super().__init__(f"{what}: HTTP {status}: {message}")


@dataclass(frozen=True)
class Secret:
    name: str
    data: dict[str, bytes]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    type: str = "Opaque"


class SecretStore:
    """Secrets of one namespace. Open with ``await SecretStore.open(namespace, kubeconfig)``;
    ``await close()`` releases the HTTP session."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self.namespace = namespace

    @classmethod
    async def open(cls, namespace: str, kubeconfig: str | None = None) -> SecretStore:
        """Connect with ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster
        ServiceAccount (what a hook Job has), else ``~/.kube/config``."""
        cfg = client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if not path and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=path or None, client_configuration=cfg, persist_config=False)
        return cls(client.ApiClient(configuration=cfg), namespace)

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, what: str, method, *args, ok: tuple[int, ...] = (), **kwargs) -> tuple[int, dict]:
        resp = await method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        try:
            raw, status = await resp.read(), resp.status
        finally:
            resp.release()
        try:
            body = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError:
            body = {"message": raw[:200].decode(errors="replace")}
        if not 200 <= status < 300 and status not in ok:
            raise SecretApiError(status, what, body.get("message", "") if isinstance(body, dict) else "")
        return status, body if isinstance(body, dict) else {}

    async def get(self, name: str) -> Secret | None:
        """The Secret, or None when it does not exist."""
        status, body = await self._call(f"get secret {self.namespace}/{name}", self._core.read_namespaced_secret,
                                        name, self.namespace, ok=(404,))
        if status == 404:
            return None
        meta = body.get("metadata") or {}
        data = {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()}
        return Secret(name, data, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
                      body.get("type") or "Opaque")

    async def put(self, secret: Secret) -> str:
        """Create the Secret, or replace it whole (data, labels, annotations) when it exists;
        returns ``"created"`` or ``"replaced"``. A Secret's type cannot change in place: one of
        another type is deleted and created again."""
        what = f"write secret {self.namespace}/{secret.name}"
        body = {"apiVersion": "v1", "kind": "Secret", "type": secret.type,
                "metadata": {"name": secret.name, "namespace": self.namespace, "labels": secret.labels,
                             "annotations": secret.annotations},
                "data": {k: base64.b64encode(v).decode() for k, v in secret.data.items()}}
        current = await self.get(secret.name)
        if current is not None and current.type != secret.type:
            await self.delete(secret.name)
            current = None
        if current is None:
            await self._call(what, self._core.create_namespaced_secret, self.namespace, body)
            return "created"
        await self._call(what, self._core.replace_namespaced_secret, secret.name, self.namespace, body)
        return "replaced"

    async def delete(self, name: str) -> bool:
        """Delete the Secret; False when it was not there."""
        status, _ = await self._call(f"delete secret {self.namespace}/{name}", self._core.delete_namespaced_secret,
                                     name, self.namespace, ok=(404,))
        return status != 404
