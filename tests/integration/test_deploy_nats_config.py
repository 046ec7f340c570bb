"""The nats.conf that deploy/k8s ships is one nats-server accepts, with the auth block that
`phalanx bus server-config` writes included (paths moved into a temp dir, POD_NAME set)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from phalanx_localstack.natsserver import find_nats_server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def test_the_shipped_nats_conf_with_the_generated_auth_block_passes_nats_server_t(tmp_path, bus_secrets):
    conf = next(d for d in yaml.safe_load_all((DEPLOY / "nats.yaml").read_text())
                if d and d["kind"] == "ConfigMap")["data"]["nats.conf"]
    etc = tmp_path / "etc"
    (etc / "tls").mkdir(parents=True)
    (etc / "auth").mkdir()
    for src, dst in ((bus_secrets.tls.cert, "tls.crt"), (bus_secrets.tls.key, "tls.key"), (bus_secrets.tls.ca, "ca.crt")):
        (etc / "tls" / dst).write_bytes(Path(src).read_bytes())
    (etc / "auth" / "auth.conf").write_text(bus_secrets.keys.server_config())
    (etc / "nats.conf").write_text(conf.replace("/etc/nats", str(etc)).replace("/data", str(tmp_path / "data")))
    out = subprocess.run([find_nats_server(), "-t", "-c", str(etc / "nats.conf")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "POD_NAME": "nats-0"})
    assert (out.returncode, "configuration file" in (out.stdout + out.stderr)) == (0, True), out.stdout + out.stderr
