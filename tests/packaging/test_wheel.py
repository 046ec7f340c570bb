"""What can be checked of the container image without a Docker engine: the wheel its build stage
makes (tools/image/wheel.sh) holds the packages and nothing of the tests or benchmarks, installs
into a clean virtualenv with its dependencies from the package index, and `phalanx` runs from
there; and the Dockerfile keeps the shape README.md describes (two stages, the wheel, a pinned
base, an unprivileged user, the health endpoint the chart probes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PHALANX_")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(["bash", str(REPO / "tools" / "image" / "wheel.sh"), str(out)], check=True, capture_output=True,
                   env={**ENV, "PYTHON": sys.executable}, timeout=300)
    (built,) = out.glob("phalanx-*.whl")
    return built


def test_the_wheel_holds_the_packages_and_no_tests_or_benchmarks(wheel):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"phalanx_cli", "phalanx_bus", "phalanx_kube", "phalanx_placement", "phalanx_binder",
            "phalanx_gang_coordinator", "phalanx_topology_discovery", "phalanx_mig_manager", "phalanx_proto"} <= tops
    assert not tops & {"phalanx_bench", "phalanx_node_fleet", "phalanx_nvmlfake", "tests", "bench", "fleet", "examples",
                       "deploy", "tools"}, tops


def test_the_wheel_installs_into_a_clean_virtualenv_and_phalanx_runs_from_it(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          str(wheel)], capture_output=True, text=True, env=ENV, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]

    def phalanx(*args: str) -> str:
        done = subprocess.run([str(venv / "bin" / "phalanx"), *args], capture_output=True, text=True, env=ENV,
                              cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert all(cmd in phalanx("--help") for cmd in ("run", "bus", "explain", "validate"))
    assert "binder" in phalanx("run", "--help") and "node-fleet" not in phalanx("run", "--help"), "no simulator"
    assert "--rotation" in phalanx("bus", "kube-secrets", "--help")  # the chart's hook Job
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import phalanx_cli; print(phalanx_cli.__file__)"],
                           capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=60).stdout
    assert where.startswith(str(venv)), where


def test_the_dockerfile_builds_a_small_pinned_non_root_image_from_the_wheel():
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(stages) == 2, "a build stage and a runtime stage"
    base = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+\.\d+)-slim", text, re.M)
    assert base, "the base image is pinned to a patch version"
    assert "tools/image/wheel.sh" in text and "--no-index --find-links /wheels" in text
    assert re.search(r"^USER 65532:65532$", text, re.M), "runs as the uid the chart's pods use"
    health = re.search(r"^HEALTHCHECK .*\n.*127\.0\.0\.1:8080/healthz", text, re.M)
    assert health and "PHALANX_HEALTH_ADDR=0.0.0.0:8080" in text, "the /healthz the chart's probes use"
    assert re.search(r'^ENTRYPOINT \["phalanx"\]$', text, re.M)
    assert not re.search(r"^COPY (tests|bench|sim|examples)", text, re.M)
