"""A certificate authority and one server certificate it signed, which every nats-server
presents on client and route connections: ``make_ca_and_server_cert`` for ``phalanx up`` and the
tests (loopback names, 7 days, nothing meant to outlive the stack), and ``issue`` for ``phalanx
bus kube-secrets``, the Helm chart's install hook (the cluster's nats Service names). An admin
may bring certificates from cert-manager or their own CA instead (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def _name(cn: str, org: str = "Phalanx (throwaway)") -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class TlsPem:
    """A CA certificate and one certificate it signed, with that certificate's key (PEM)."""

    ca: bytes
    cert: bytes
    key: bytes


def issue(names: tuple[str, ...], days: int, *, org: str = "Phalanx (throwaway)") -> TlsPem:
    """A fresh CA (EC P-256) and a certificate signed by it for ``names`` (DNS names, wildcards
    and IP addresses; the first is the subject), usable as a server and as a client, since
    nats-servers present it to each other on routes. The CA key is not kept: a new certificate
    comes with a new CA."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("phalanx CA", org)
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = (x509.CertificateBuilder().subject_name(_name(names[0], org)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return TlsPem(ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM),
                  _pem_key(key))


def make_ca_and_server_cert(directory: str | Path, names: tuple[str, ...] = LOOPBACK_NAMES,
                            days: int = 7) -> TlsFiles:
    """Write ``ca.pem``, ``server.pem`` and ``server-key.pem`` (mode 0600) into ``directory``:
    ``issue(names, days)`` as files."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pem = issue(names, days)
    files = TlsFiles(d / "ca.pem", d / "server.pem", d / "server-key.pem")
    files.ca.write_bytes(pem.ca)
    files.cert.write_bytes(pem.cert)
    files.key.touch(mode=0o600)
    files.key.write_bytes(pem.key)
    return files
