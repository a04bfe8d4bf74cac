#!/usr/bin/env bash
# Build a real kube-apiserver + kube-controller-manager (Kubernetes 1.20, from Debian bookworm's
# `kubernetes` source package, fully vendored, offline Go build) and cache them together with
# etcd (from Debian's `etcd-server`) for the test suite (tests/k8s/cluster.py).
#
#   bash tests/k8s/build-kube.sh          # ~10 min on 2 cores the first time, seconds afterwards
#
# Cache: ${HORIZONSERVE_KUBE_CACHE:-$HOME/.cache/horizonserve/kube-1.20}/bin/
#   kube-apiserver  kube-controller-manager  etcd  (+ VERSION)
# Set HORIZONSERVE_KUBE_REBUILD=1 to rebuild even when the cache is complete.
# Needs root (or passwordless sudo) for apt-get on the first run only.
set -euo pipefail

CACHE="${HORIZONSERVE_KUBE_CACHE:-$HOME/.cache/horizonserve/kube-1.20}"
BIN="$CACHE/bin"
BINARIES=(kube-apiserver kube-controller-manager etcd)
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
APT_PACKAGES=(golang-go rsync golang-github-modern-go-reflect2-dev openssl dpkg-dev make)
export DEBIAN_FRONTEND=noninteractive

log() { printf '[build-kube %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cache_complete() {
    local b
    for b in "${BINARIES[@]}"; do
        [[ -x "$BIN/$b" ]] || return 1
    done
    "$BIN/kube-apiserver" --version >/dev/null 2>&1 || return 1
    "$BIN/etcd" --version >/dev/null 2>&1 || return 1
}

if [[ "${HORIZONSERVE_KUBE_REBUILD:-0}" != 1 ]] && cache_complete; then
    log "cache complete in $BIN: $("$BIN/kube-apiserver" --version 2>&1 | head -1); nothing to do"
    exit 0
fi

mkdir -p "$CACHE"
# Serialize concurrent builds (several pytest processes / CI jobs on one machine).
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
    log "another build holds $CACHE/.build.lock; waiting for it"
    flock 9
fi
if [[ "${HORIZONSERVE_KUBE_REBUILD:-0}" != 1 ]] && cache_complete; then
    log "cache completed by a concurrent build in $BIN; nothing to do"
    exit 0
fi

SUDO=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo: cannot apt-get install"
    SUDO=(sudo -n)
fi
apt_get() { "${SUDO[@]}" apt-get -y -q -o Dpkg::Use-Pty=0 "$@"; }

T0=$SECONDS

# ---------------------------------------------------------------------------------------------
# 1. apt: a deb-src entry for Debian, then the toolchain.
# ---------------------------------------------------------------------------------------------
SRC_LIST=/etc/apt/sources.list.d/horizonserve-deb-src.sources
if [[ ! -f "$SRC_LIST" ]]; then
    log "adding Debian deb-src entries: $SRC_LIST"
    tmp_src="$(mktemp)"
    if [[ -f /etc/apt/sources.list.d/debian.sources ]] \
        && grep -q '^Types:.*\bdeb\b' /etc/apt/sources.list.d/debian.sources; then
        # Same mirrors / suites / keyring as the binary entries.
        sed -E 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$tmp_src"
    else
        cat >"$tmp_src" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
    "${SUDO[@]}" install -m 0644 "$tmp_src" "$SRC_LIST"
    rm -f "$tmp_src"
fi

log "apt-get update"
apt_get update
log "apt-get install ${APT_PACKAGES[*]}"
apt_get install --no-install-recommends "${APT_PACKAGES[@]}"

command -v go >/dev/null || die "go not found after installing golang-go"
[[ -d "$REFLECT2_SRC" ]] || die "$REFLECT2_SRC missing after installing golang-github-modern-go-reflect2-dev"
log "toolchain: $(go version)"

# ---------------------------------------------------------------------------------------------
# 2. Work tree (removed on exit, success or failure: it holds ~2.5 GB).
# ---------------------------------------------------------------------------------------------
WORK="$(mktemp -d "${HORIZONSERVE_KUBE_BUILD_DIR:-${TMPDIR:-/tmp}}/horizonserve-kube-build.XXXXXX")"
cleanup() {
    local rc=$?
    log "removing build tree $WORK"
    chmod -R u+w "$WORK" 2>/dev/null || true   # the Go module cache is read-only
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

# etcd: extract the package's binary instead of installing etcd-server, so no system etcd service
# gets started on port 2379 by the package's maintainer scripts.
log "fetching etcd-server .deb"
mkdir -p "$WORK/etcd"
(cd "$WORK/etcd" && apt-get download -q etcd-server >/dev/null)
dpkg-deb -x "$WORK"/etcd/etcd-server_*.deb "$WORK/etcd/root"
ETCD_BIN="$WORK/etcd/root/usr/bin/etcd"
[[ -x "$ETCD_BIN" ]] || die "no usr/bin/etcd in etcd-server package"
log "etcd: $("$ETCD_BIN" --version 2>&1 | head -1)"

log "fetching Debian source package 'kubernetes' (apt-get source)"
mkdir -p "$WORK/src"
(cd "$WORK/src" && apt-get source -q kubernetes >"$WORK/apt-source.log" 2>&1) \
    || { tail -20 "$WORK/apt-source.log" >&2; die "apt-get source kubernetes failed"; }
KROOT="$(find "$WORK/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
[[ -n "$KROOT" && -d "$KROOT/vendor" && -d "$KROOT/cmd/kube-apiserver" ]] \
    || die "unpacked source has no vendor/ or cmd/kube-apiserver (got '${KROOT:-nothing}')"

DEB_VERSION="$(dpkg-parsechangelog -l "$KROOT/debian/changelog" -S Version)"
UPSTREAM="${DEB_VERSION#*:}"
UPSTREAM="${UPSTREAM#*really}"
UPSTREAM="${UPSTREAM%%-*}"
[[ "$UPSTREAM" =~ ^1\.20\.[0-9]+$ ]] || die "expected Kubernetes 1.20.x, Debian has $DEB_VERSION"
log "source: kubernetes $DEB_VERSION (upstream v$UPSTREAM) in $KROOT"

# vendored reflect2 v1.0.1 crashes under Go >= 1.18 (first custom-resource request): use 1.0.2.
log "replacing vendor/github.com/modern-go/reflect2 with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
rm -rf "$KROOT/vendor/github.com/modern-go/reflect2"
cp -rL "$REFLECT2_SRC" "$KROOT/vendor/github.com/modern-go/reflect2"
find "$KROOT/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete

# No .git: give the build its version explicitly (what `kube-apiserver --version` reports).
cat >"$WORK/version.env" <<EOF
KUBE_GIT_VERSION='v$UPSTREAM'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_COMMIT='debian-$DEB_VERSION'
KUBE_GIT_TREE_STATE='clean'
EOF

# ---------------------------------------------------------------------------------------------
# 3. Build (offline: everything is vendored).
# ---------------------------------------------------------------------------------------------
log "building cmd/kube-apiserver cmd/kube-controller-manager (about 10 min on 2 cores)"
export GOCACHE="$WORK/gocache" GOPROXY=off CGO_ENABLED=0
export KUBE_GIT_VERSION_FILE="$WORK/version.env"
export KUBE_VERBOSE="${KUBE_VERBOSE:-1}"
if ! (cd "$KROOT" && make WHAT="cmd/kube-apiserver cmd/kube-controller-manager") 2>&1 \
    | sed -u 's/^/  | /' >&2; then
    die "make failed (output above)"
fi

OUT_DIR="$KROOT/_output/bin"
[[ -x "$OUT_DIR/kube-apiserver" ]] || OUT_DIR="$(dirname "$(find "$KROOT/_output" -type f -name kube-apiserver | head -1)")"
for b in kube-apiserver kube-controller-manager; do
    [[ -x "$OUT_DIR/$b" ]] || die "build produced no $b"
done

# ---------------------------------------------------------------------------------------------
# 4. Install into the cache atomically (binary by binary: temp name, then rename).
# ---------------------------------------------------------------------------------------------
mkdir -p "$BIN"
for b in kube-apiserver kube-controller-manager; do
    install -m 0755 "$OUT_DIR/$b" "$BIN/.$b.tmp"
    mv -f "$BIN/.$b.tmp" "$BIN/$b"
done
install -m 0755 "$ETCD_BIN" "$BIN/.etcd.tmp"
mv -f "$BIN/.etcd.tmp" "$BIN/etcd"
{
    echo "kubernetes-debian-source=$DEB_VERSION"
    echo "kube-apiserver=$("$BIN/kube-apiserver" --version 2>&1 | head -1)"
    echo "etcd=$("$BIN/etcd" --version 2>&1 | head -1)"
    echo "go=$(go version)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$BIN/VERSION"

cache_complete || die "cache check failed after install"
log "done in $((SECONDS - T0)) s: $(tr '\n' ' ' <"$BIN/VERSION")"
log "binaries in $BIN"
