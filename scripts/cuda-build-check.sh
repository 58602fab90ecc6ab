#!/usr/bin/env bash
# The README's two commands under the CUDA build of torch that the public registry serves, on a
# machine without a GPU (CPU mode must decide "no GPU" by the devices, not by the build).
#
#   bash scripts/cuda-build-check.sh [VERSION] [PYTEST ARGS...]   # default: dev.sh's torch pin
#
# Makes (or reuses) a venv outside the checkout, $DEV_VENV, default
# ~/.cache/tokenring-xdit/cuda-torch-VERSION; installs torch==VERSION from $TORCH_INDEX (default
# https://pypi.org/simple; its Linux x86_64 wheel is the CUDA build, ~3 GB with its nvidia-*
# libraries) while ignoring local pip configuration (find-links and extra indexes, which may
# serve a CPU build), and refuses to go on unless torch.version.cuda is set. Then runs
# `scripts/dev.sh test` (the suite; GPU tests stay deselected) and `scripts/dev.sh run` (the
# compare job, into a temporary folder) in that venv and prints the time of each stage.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PIN="$(sed -n 's/^TORCH_SPEC="${TORCH_SPEC:-torch==\(.*\)}"$/\1/p' "$ROOT/scripts/dev.sh")"
VERSION="${1:-$PIN}"
[[ $# -gt 0 ]] && shift
export DEV_VENV="${DEV_VENV:-$HOME/.cache/tokenring-xdit/cuda-torch-$VERSION}"
export TORCH_SPEC="torch==$VERSION"
PY="$DEV_VENV/bin/python"

log() { printf 'cuda-build-check: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Every pip call: the public registry as a new user gets it, not this machine's local mirrors.
public_pip() {
    env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_NO_INDEX PIP_CONFIG_FILE=/dev/null \
        PIP_INDEX_URL="${TORCH_INDEX:-https://pypi.org/simple}" "$@"
}

stage() { # name command...: run it, record its wall time and exit status
    local name="$1" start=$SECONDS status=0
    shift
    log "$name: $*"
    "$@" || status=$?
    TIMES+=("$name $((SECONDS - start)) s, exit $status")
    return "$status"
}

TIMES=()
if [[ ! -x "$PY" ]]; then
    mkdir -p "$(dirname "$DEV_VENV")"
    stage venv "${PYTHON:-python3}" -m venv "$DEV_VENV"
fi
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" \
    2>/dev/null; then
    stage torch public_pip "$PY" -m pip install "torch==$VERSION"
fi
build="$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>/dev/null)"
read -r got cuda gpu <<<"$build"
[[ "$cuda" != None ]] || die "torch $got in $DEV_VENV is a CPU build; remove the venv and rerun"
[[ "$gpu" == False ]] || log "warning: this machine has a GPU; the check is meant for one without"
log "torch $got (CUDA $cuda build), GPU available: $gpu"

out="$(mktemp -d)"
rc=0 # dev.sh's own pip call (the project and its dependencies): the public registry too
stage suite public_pip bash "$ROOT/scripts/dev.sh" test "$@" || rc=$?
stage compare public_pip bash "$ROOT/scripts/dev.sh" run --no-progress --out "$out" || rc=$?
log "torch $got (CUDA $cuda), venv $DEV_VENV; outputs in $out"
for t in "${TIMES[@]}"; do log "  $t"; done
exit "$rc"
