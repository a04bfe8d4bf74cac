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
#   TIMEOUT=120s bash charts/upgrade-crds.sh         # how long a CRD may take to serve (60s)
#
# Uses kubectl's current context (or $KUBECONFIG; $KUBECTL picks the binary). Server-side apply
# with a fixed field manager: it works whether the CRD was created by Helm, by
# `kubectl apply -f manifests/install.yaml` or by an earlier run of this script, and it has no
# size limit on the last-applied annotation (generated CRDs are large).
#
# Before anything is applied, every stored OmniService is validated against the NEW schema by
# the API server itself: the new CRD is installed under a throw-away group
# (upgrade-check.horizonserve.io), each stored object is created there with --dry-run=server,
# and the throw-away CRD is removed. If any object fails, nothing is applied and the objects are
# listed with the API server's reasons (fix or delete them first): a stored object the new
# schema refuses could otherwise no longer be updated, and its finalizer not removed.
# SKIP_STORED_CHECK=1 skips this check. Needs python3 (JSON handling).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KUBECTL="${KUBECTL:-kubectl}"
FIELD_MANAGER="horizonserve-crds"
TIMEOUT="${TIMEOUT:-60s}"

log() { printf '[upgrade-crds] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ "$TIMEOUT" =~ ^[0-9]+s?$ ]] || die "TIMEOUT must be whole seconds, e.g. 60s (got '$TIMEOUT')"

# Wait until CRD $1 (crd/NAME or customresourcedefinition.../NAME) is Established, at most
# $TIMEOUT. Polls rather than `kubectl wait --for=condition=Established`: on a CRD created a
# moment before, whose status has no conditions yet, that fails at once instead of waiting.
wait_established() {
    local name="$1" status deadline=$((SECONDS + 10#${TIMEOUT%s}))
    while true; do
        status="$("$KUBECTL" get "$name" \
            -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" \
            || status=""
        [[ "$status" == True ]] && return 0
        ((SECONDS < deadline)) || return 1
        sleep 1
    done
}

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

CHECK_GROUP="upgrade-check.horizonserve.io"

# Validate the stored OmniServices against the schema in CRD file $1 (see the header).
check_stored() {
    local file="$1" tmp
    grep -q "name: omniservices.horizonserve.io" "$file" || return 0
    "$KUBECTL" get crd omniservices.horizonserve.io >/dev/null 2>&1 || return 0
    tmp="$(mktemp -d)"
    "$KUBECTL" create --dry-run=client -o json -f "$file" >"$tmp/new.json"
    python3 - "$tmp/new.json" "$CHECK_GROUP" >"$tmp/crd.json" <<'PY'
import json, sys
crd = json.load(open(sys.argv[1]))
group = sys.argv[2]
crd["metadata"] = {"name": f"{crd['spec']['names']['plural']}.{group}"}
crd["spec"]["group"] = group
json.dump(crd, sys.stdout)
PY
    local name="omniservices.$CHECK_GROUP"
    # A check CRD an earlier run left (interrupted, or still being deleted) is removed first:
    # objects cannot be created in a CRD that is terminating.
    "$KUBECTL" delete crd "$name" --ignore-not-found --wait=true --timeout="$TIMEOUT" >/dev/null
    "$KUBECTL" apply -f "$tmp/crd.json" >/dev/null
    if ! wait_established "crd/$name"; then
        "$KUBECTL" delete crd "$name" --wait=false >/dev/null 2>&1 || true
        rm -rf "$tmp"
        die "the check CRD $name did not become Established within $TIMEOUT"
    fi
    "$KUBECTL" get omniservices.horizonserve.io -A -o json | python3 -c '
import json, sys
group = sys.argv[1]
for item in json.load(sys.stdin)["items"]:
    meta = item["metadata"]
    out = {"apiVersion": group + "/" + item["apiVersion"].split("/")[1], "kind": item["kind"],
           "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
           "spec": item.get("spec", {})}
    print(meta["namespace"] + "/" + meta["name"], json.dumps(out))
' "$CHECK_GROUP" >"$tmp/objects"
    local bad=() id obj err count
    count="$(wc -l <"$tmp/objects")"
    while read -r id obj; do
        if ! err="$(printf '%s' "$obj" | "$KUBECTL" create --dry-run=server -f - -o name 2>&1)"; then
            bad+=("$id: ${err//$'\n'/ }")
        fi
    done <"$tmp/objects"
    "$KUBECTL" delete crd "$name" --wait=false >/dev/null 2>&1 || true
    rm -rf "$tmp"
    if [[ ${#bad[@]} -gt 0 ]]; then
        log "the new schema in $file refuses ${#bad[@]} stored OmniService(s); nothing applied:"
        for line in "${bad[@]}"; do log "  $line"; done
        die "fix or delete the OmniServices above, then run this again"
    fi
    log "$count stored OmniService(s) valid under the new schema"
}

if [[ "${SKIP_STORED_CHECK:-0}" != 1 ]]; then
    for f in "${files[@]}"; do
        check_stored "$f"
    done
fi

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
        wait_established "$n" || die "$n did not become Established within $TIMEOUT"
        log "$n established; served versions: $("$KUBECTL" get "$n" \
            -o jsonpath='{range .spec.versions[?(@.served==true)]}{.name}{" "}{end}')"
    done
fi
log "done (${#names[@]} CRD(s))"
