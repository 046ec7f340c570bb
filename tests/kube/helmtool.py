"""The helm CLI for the chart tests, and checks of what the chart's credentials hook wrote.

``helm`` comes from ``tools/helm/build.sh`` (built from Go modules, cached under ~/.cache); when
it is missing the test fails with the command that builds it, never skips. Every call gets its
own HELM_*_HOME under the control plane's work dir and the plane's admin kubeconfig.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import tempfile
from pathlib import Path

import yaml
from cryptography import x509
from kubeharness import REPO, ControlPlane, HarnessError

CHART = REPO / "deploy" / "helm" / "phalanx"
BUILD_SH = REPO / "tools" / "helm" / "build.sh"
SECRET_MATERIAL = re.compile(r"-----BEGIN|\bS[OAU][A-Z2-7]{50,}|eyJ[\w-]{10,}\.eyJ")
"""A PEM block, an NKEY seed (operator, account or user), or a JWT: never printed or templated."""


def helm_binary() -> Path:
    how = "build it with `bash tools/helm/build.sh` (cached under ~/.cache/phalanx-helm; see tools/helm/README.md)"
    if os.environ.get("CI"):
        how = "the CI job must run `make kube` (tools/helm/build.sh) before the Kubernetes tiers"
    try:
        out = subprocess.run(["bash", str(BUILD_SH), "--print-bin-dir"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        raise HarnessError(f"cannot ask {BUILD_SH} for the bin dir ({e}); {how}") from e
    helm = Path(out[-1] if out else "") / "helm"
    if not os.access(helm, os.X_OK):
        raise HarnessError(f"helm missing at {helm}; {how}")
    return helm


class Helm:
    def __init__(self, binary: Path, plane: ControlPlane | None = None) -> None:
        self.binary = binary
        self.plane = plane
        self.home = home = Path(tempfile.mkdtemp(prefix="helm-", dir=plane.workdir if plane else None))
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("HELM_")},
                    "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}
        if plane is not None:
            self.env["KUBECONFIG"] = str(plane.kubeconfig)

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            tail = self.plane.tail("kube-apiserver", 10) if self.plane else ""
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}\n{tail}")
        return done

    def template(self, release: str, namespace: str, *args: str) -> list[dict]:
        out = self.run("template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


def values_file(directory: Path, values: dict) -> str:
    path = directory / f"values-{len(list(directory.glob('values-*.json')))}.json"
    path.write_text(json.dumps(values))  # JSON is YAML
    return str(path)


# -- what the credentials hook wrote ---------------------------------------------------------------
def _jwt_claims(token: str) -> dict:
    from phalanx_bus.credentials import decode_jwt_claims

    return decode_jwt_claims(token)


def account_signing_roles(auth_conf: str) -> tuple[str, dict[str, str], str]:
    """(operator public key, {signing key: role} of the PHALANX account, account public key)
    from the nats-server auth block."""
    operator = json.loads(re.search(r"^operator: (\".*\")$", auth_conf, re.M).group(1))
    jwts = [json.loads(m) for m in re.findall(r"^  \w+: (\".*\")$", auth_conf, re.M)]
    accounts = [c for c in map(_jwt_claims, jwts) if c["nats"].get("signing_keys")]
    (account,) = accounts
    roles = {s["key"]: s["role"] for s in account["nats"]["signing_keys"]}
    return _jwt_claims(operator)["sub"], roles, account["sub"]


def creds_issuer(creds: str) -> tuple[str, str]:
    """(issuer, name) of the user JWT in a ``.creds`` file."""
    token = creds.split("-----BEGIN NATS USER JWT-----")[1].split("------END NATS USER JWT------")[0].strip()
    claims = _jwt_claims(token)
    return claims["iss"], claims["name"]


def check_certificate(tls_crt: bytes, ca_crt: bytes, names: set[str]) -> None:
    """The certificate names ``names`` (SANs) and is signed by the CA."""
    cert, ca = x509.load_pem_x509_certificate(tls_crt), x509.load_pem_x509_certificate(ca_crt)
    sans = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName))
    assert names <= sans, (names, sans)
    cert.verify_directly_issued_by(ca)


class _HookFiles:
    """``NatsServer``'s security: the hook's certificate and auth block, as files in ``d``."""

    def __init__(self, d: Path) -> None:
        self.d = d

    def server_config(self) -> str:
        d = self.d
        return (f'tls {{\n  cert_file: "{d / "tls.crt"}"\n  key_file: "{d / "tls.key"}"\n  ca_file: "{d / "ca.crt"}"\n}}\n'
                'include "auth.conf"\n')  # nats-server resolves includes next to its config file

    def route_tls(self) -> str:
        return ""


async def nats_accepts(workdir: Path, secrets: dict[str, dict[str, bytes]], namespace: str) -> dict:
    """Serve the hook's auth block and certificate with a real nats-server on loopback and
    connect as admin and as placement, verifying the server as ``nats.<namespace>.svc`` against
    the hook's CA; the admin's JetStream account info (the proof its credential is the admin's)."""
    import nats

    from phalanx_localstack.natsserver import NatsServer

    d = workdir / "nats-check"
    d.mkdir(exist_ok=True)
    files = {"auth.conf": secrets["phalanx-nats-auth"]["auth.conf"], "tls.crt": secrets["phalanx-nats-tls"]["tls.crt"],
             "tls.key": secrets["phalanx-nats-tls"]["tls.key"], "ca.crt": secrets["phalanx-nats-tls"]["ca.crt"],
             "admin.creds": secrets["phalanx-nats-admin"]["creds"],
             "placement.creds": secrets["phalanx-nats-placement"]["creds"]}
    for name, data in files.items():
        (d / name).write_bytes(data)
    server = NatsServer(store_dir=str(d), security=_HookFiles(d))
    server.start()
    try:
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        info = {}
        for who in ("admin", "placement"):
            nc = await nats.connect(server.url, tls=ctx, tls_hostname=f"nats.{namespace}.svc",
                                    user_credentials=str(d / f"{who}.creds"), allow_reconnect=False,
                                    connect_timeout=5, max_reconnect_attempts=0)
            try:
                if who == "admin":
                    info = (await nc.jetstream().account_info()).__dict__
            finally:
                await nc.close()
        return info
    finally:
        server.close()
