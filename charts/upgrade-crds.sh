#!/usr/bin/env bash
# Upgrade the HorizonServe CRDs in a cluster. Run it BEFORE `helm upgrade`.
#
# Helm installs a chart's crds/ directory on the first `helm install` only: it never upgrades
# (nor deletes) CRDs afterwards, so a new chart version whose OmniService schema changed needs
# this step first.
#
#   bash charts/upgrade-crds.sh                      # the CRDs of the chart beside this script
#   bash charts/upgrade-crds.sh path/to/horizonserve # an unpacked chart (`helm pull --untar`)
#   bash charts/upgrade-crds.sh crds/foo.yaml        # or CRD files
#   DRY_RUN=1 bash charts/upgrade-crds.sh            # server-side dry run: validate, change nothing
#
# Uses kubectl's current context (or $KUBECONFIG; $KUBECTL picks the binary). Server-side apply
# with a fixed field manager: it works whether the CRD was created by Helm, by
# `kubectl apply -f manifests/install.yaml` or by an earlier run of this script, and it has no
# size limit on the last-applied annotation (generated CRDs are large). Existing OmniServices
# are kept; the API server validates them against the new schema on their next write.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KUBECTL="${KUBECTL:-kubectl}"
FIELD_MANAGER="horizonserve-crds"
TIMEOUT="${TIMEOUT:-60s}"

log() { printf '[upgrade-crds] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v "$KUBECTL" >/dev/null 2>&1 || die "kubectl not found (set KUBECTL=/path/to/kubectl)"

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("$HERE/horizonserve")

files=()
for t in "${targets[@]}"; do
    if [[ -d "$t/crds" ]]; then
        t="$t/crds"
    fi
    if [[ -d "$t" ]]; then
        shopt -s nullglob
        found=("$t"/*.yaml "$t"/*.yml)
        shopt -u nullglob
        [[ ${#found[@]} -gt 0 ]] || die "no CRD files in $t"
        files+=("${found[@]}")
    elif [[ -f "$t" ]]; then
        files+=("$t")
    else
        die "not a chart, directory or file: $t"
    fi
done

dry=()
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    dry=(--dry-run=server)
    log "dry run: nothing will be changed"
fi

names=()
for f in "${files[@]}"; do
    log "applying $f"
    out="$("$KUBECTL" apply --server-side --force-conflicts --field-manager="$FIELD_MANAGER" \
        "${dry[@]}" -o name -f "$f")" || die "kubectl apply failed for $f"
    while IFS= read -r line; do
        [[ -n "$line" ]] && names+=("$line")
    done <<<"$out"
done

if [[ ${#dry[@]} -eq 0 ]]; then
    for n in "${names[@]}"; do
        "$KUBECTL" wait --for=condition=Established --timeout="$TIMEOUT" "$n" >/dev/null \
            || die "$n did not become Established within $TIMEOUT"
        log "$n established; served versions: $("$KUBECTL" get "$n" \
            -o jsonpath='{range .spec.versions[?(@.served==true)]}{.name}{" "}{end}')"
    done
fi
log "done (${#names[@]} CRD(s))"
