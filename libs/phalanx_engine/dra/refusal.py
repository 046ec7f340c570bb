"""Why a pod's claims cannot be allocated on a node, as data, in kube-scheduler's words (its
DynamicResources plugin, Kubernetes 1.36). Made by ``phalanx_engine.dra.allocate``; read by the
placement service (``Refusal.status`` turns one into the engine's ``Status``) and by people.

``message`` is the plugin's own status text, unchanged, so that tools grepping pod events keep
working: ``cannot allocate all claims``, ``invalid resource pools were encountered``,
``resourceclaim not available on the node``, ``request <req>: device class <class> does not
exist``, or for an error the error itself (``class gpu.nvidia.com: selector #0: CEL runtime
error: no such key: foo``). ``detail`` adds what upstream does not say: which claim and request,
and why (``claim ns/c, request gpu: 2 of 8 matching devices are free``).

``error`` marks what kube-scheduler returns as an ``Error`` status (a broken selector, a pool
being rewritten under an "all devices" request): the pod's attempt fails and is retried with
backoff, on any node. Otherwise the node is unschedulable for the pod, and ``resolvable`` says
whether waiting for other pods to release devices can help.
"""

from __future__ import annotations

import enum

import msgspec

from phalanx_engine.status import Code, Reason, Status

PLUGIN = "DynamicResources"

CANNOT_ALLOCATE = "cannot allocate all claims"
INVALID_POOLS = "invalid resource pools were encountered"
NOT_ON_NODE = "resourceclaim not available on the node"


class RefusalCode(enum.StrEnum):
    """Stable codes (metrics, tests); the texts are for people."""

    CANNOT_ALLOCATE = "dra-cannot-allocate"
    INVALID_POOLS = "dra-invalid-pools"
    NOT_ON_NODE = "dra-claim-not-on-node"
    CLASS_MISSING = "dra-device-class-missing"
    ERROR = "dra-error"


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """One node's answer when the pod's claims do not fit there."""

    code: RefusalCode
    message: str
    detail: str = ""
    claim: str = ""
    """``<namespace>/<name>`` of the claim concerned, when one is."""
    request: str = ""
    """The request (``req`` or ``req/sub``) concerned, when one is."""
    resolvable: bool = False
    error: bool = False

    def status(self, plugin: str = PLUGIN) -> Status:
        """The engine's ``Status`` for this refusal (an error is not resolvable)."""
        code = {RefusalCode.ERROR: Code.DRA_ERROR, RefusalCode.CLASS_MISSING: Code.DRA_CLASS_MISSING,
                RefusalCode.NOT_ON_NODE: Code.DRA_CLAIM_NOT_ON_NODE}.get(self.code, Code.DRA_CANNOT_ALLOCATE)
        return Status(plugin, (Reason(code, self.message, detail=self.detail),), self.resolvable and not self.error)


class Fatal(Exception):
    """Raised inside the allocator to stop the search with a refusal (an error)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def unschedulable(code: RefusalCode, message: str, *, detail: str = "", claim: str = "", request: str = "",
                  resolvable: bool = False) -> Refusal:
    return Refusal(code=code, message=message, detail=detail, claim=claim, request=request, resolvable=resolvable)


def error(message: str, *, claim: str = "", request: str = "") -> Refusal:
    return Refusal(code=RefusalCode.ERROR, message=message, claim=claim, request=request, error=True)
