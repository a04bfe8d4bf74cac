#!/usr/bin/env bash
# Install the pinned CPU set of vLLM 0.30.0 + vLLM-Omni 0.30.0 that tests/vllm runs against.
#
#   bash .ci/install-vllm.sh [VENV]        (VENV defaults to .venv; created when missing)
#
# What goes in is exactly tests/vllm/requirements-cpu.txt, installed with --no-deps:
#   * torch 2.13.0 CPU build, from a wheel on local disk (pinned as 2.13.0+cpu: PyPI only has
#     the multi-GB CUDA build of 2.13.0, and the local version label makes pip refuse it);
#   * vllm 0.30.0 and vllm-omni 0.30.0 without their declared dependencies (CUDA kernels,
#     flashinfer, triton, torchvision/torchaudio, ...);
#   * the pure-Python (or plain CPU wheel) packages that the scheduler, its config objects and
#     the plugin paths need to import, found by trial (see the comments in that file).
# That is enough to build and drive the real schedulers on CPU; it is NOT a serving install.
#
# Idempotent: when every pin is already installed and the schedulers import, it exits at once.
# Env: HS_TORCH_WHEEL_DIR  folder holding torch-2.13.0+cpu-*.whl (default: /opt/wheels).
set -euo pipefail

VENV="${1:-.venv}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/tests/vllm/requirements-cpu.txt"
TORCH_WHEEL_DIR="${HS_TORCH_WHEEL_DIR:-/opt/wheels}"

LOG_TAG=install-vllm
# shellcheck source=venv-lib.sh
source "$ROOT/.ci/venv-lib.sh"
ensure_venv "$VENV"

# Every python call uses -I: never put the working directory on sys.path (the repo root has an
# `operator/` package that shadows the standard library module in a plain venv).
pins_satisfied() {
    "$PY" -I - "$REQ" <<'EOF'
import importlib.metadata as md
import sys

missing = []
for raw in open(sys.argv[1], encoding="utf-8"):
    line = raw.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = (part.strip() for part in line.split("=="))
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have != want:
        missing.append(f"{name}=={want} (have {have})")
if missing:
    print("not pinned yet: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
EOF
}

schedulers_import() {
    "$PY" -I -c "
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler, OmniARAsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
" >/dev/null 2>&1
}

if pins_satisfied 2>/dev/null && schedulers_import; then
    log "pinned vllm/vllm-omni CPU set already installed in $VENV; nothing to do"
    exit 0
fi

find_links=()
if compgen -G "$TORCH_WHEEL_DIR/torch-2.13.0+cpu-*.whl" >/dev/null; then
    find_links=(--find-links "$TORCH_WHEEL_DIR")
elif ! "$PY" -I -c "import importlib.metadata as m; assert m.version('torch') == '2.13.0+cpu'" \
    2>/dev/null; then
    log "no torch-2.13.0+cpu wheel in $TORCH_WHEEL_DIR (set HS_TORCH_WHEEL_DIR);"
    log "refusing to let pip fall back to the multi-GB CUDA build"
    exit 1
fi

start=$SECONDS
log "installing $(grep -cE '^[A-Za-z0-9]' "$REQ") pinned packages into $VENV (--no-deps)"
"$PY" -I -m pip install --disable-pip-version-check --no-input --progress-bar off --no-deps \
    ${find_links[@]+"${find_links[@]}"} -r "$REQ"

if ! schedulers_import; then
    log "installed, but the schedulers do not import:"
    "$PY" -I -c "from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler" || true
    exit 1
fi
log "done in $((SECONDS - start))s; torch/vllm/vllm-omni: $(
    "$PY" -I -c 'import importlib.metadata as m; print(*(m.version(d) for d in ("torch", "vllm", "vllm-omni")))'
)"
