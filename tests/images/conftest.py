"""Fixtures for the container-image tests: the images images/build.sh built, run by podman.

The images live in this machine's container storage (/var/lib/containers). Without them every
test here skips with one reason; with HORIZONSERVE_REQUIRE_IMAGES=1 (set by .ci/run after
building them) a missing image fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import socket
import subprocess
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_hash = runpy.run_path(str(ROOT / "images" / "source_hash.py"))
LABEL: str = _hash["LABEL"]
source_hash = _hash["source_hash"]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OPERATOR_IMAGE = f"localhost/horizonserve-operator:{VERSION}"
SERVING_IMAGE = f"localhost/horizonserve-serving-reference:{VERSION}"
SKIP_REASON = (
    "container images not built: run `bash images/build.sh` (root; installs mmdebstrap, "
    "buildah, podman and runc)"
)
STALE_REASON = (
    "container images built from older sources: run `bash images/build.sh` again (warm: about 30 s)"
)
# How this sandbox lets podman run a container: runc (crun refuses the host's hybrid cgroups)
# and limits no higher than the host's (no CAP_SYS_RESOURCE to raise them).
PODMAN_RUN = (
    "podman", "--runtime", "runc", "run", "--rm", "--detach", "--network", "host",
    "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
)  # fmt: skip


def _built_from(image: str) -> str | None:
    """The source hash the image was built from ('' unlabelled), None when it is missing."""
    if shutil.which("podman") is None:
        return None
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def require_image(image: str) -> str:
    """The image, built from the tree's current sources; else skip with one reason (fail when
    HORIZONSERVE_REQUIRE_IMAGES=1)."""
    built = _built_from(image)
    if built == source_hash():
        return image
    why = SKIP_REASON if built is None else STALE_REASON
    if os.environ.get("HORIZONSERVE_REQUIRE_IMAGES") == "1":
        pytest.fail(f"{image}: {why} (HORIZONSERVE_REQUIRE_IMAGES=1)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def serving_image() -> str:
    return require_image(SERVING_IMAGE)


@pytest.fixture(scope="session")
def operator_image() -> str:
    return require_image(OPERATOR_IMAGE)


@contextlib.contextmanager
def container(image: str, command: Sequence[str], args: Sequence[str] = ()) -> Iterator[str]:
    """Run `image` detached (as its own user, read-only root, no capabilities, like the chart),
    yield its name; removed on exit."""
    name = f"hs-test-{uuid.uuid4().hex[:8]}"
    run = [
        *PODMAN_RUN, "--name", name, "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", *args, image, *command,
    ]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"podman run failed: {done.stderr}"
    try:
        yield name
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "2", name], capture_output=True, timeout=60)


def logs(name: str) -> str:
    done = subprocess.run(
        ["podman", "logs", name], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


def running(name: str) -> bool:
    done = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Running}}", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip() == "true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, bytes]:
    """One GET (no body) or JSON POST; an HTTP error status is returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def up(url: str, timeout: float = 1.0) -> bool:
    try:
        return http(url, timeout=timeout)[0] == 200
    except OSError:
        return False
