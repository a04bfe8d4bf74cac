# Shared prologue of the .ci install scripts (sourced, not run).
#   LOG_TAG=name; source .ci/venv-lib.sh; ensure_venv DIR   -> sets PY to DIR/bin/python
# Every python call uses -I: the repository root has an `operator/` package that shadows the
# standard library module when the working directory is on sys.path.

log() { printf '[%s] %s\n' "${LOG_TAG:-ci}" "$*" >&2; }

ensure_venv() {
    if [[ ! -x "$1/bin/python" ]]; then
        log "creating venv $1"
        python3 -I -m venv "$1"
    fi
    PY="$1/bin/python"
}
