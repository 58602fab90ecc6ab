#!/usr/bin/env bash
# Set up .venv and run the demo or the test suite.
#
#   bash scripts/dev.sh run  [ARGS...]         # tokenring-xdit (default: compare)
#   bash scripts/dev.sh test [PYTEST ARGS...]  # python -m pytest -q -n 2 tests [ARGS]
#
# Creates .venv if missing; installs torch only if the venv cannot import it (TORCH_SPEC, default
# torch==2.13.0); installs this project editable with its test extras and fails if that replaced
# torch. A later call skips pip while pyproject.toml, the checkout's path and Python are unchanged.
# PYTHON picks the interpreter that creates the venv (default python3); DEV_VENV another venv
# folder than .venv (scripts/cuda-build-check.sh keeps one per torch build outside the checkout).
# TEST_WORKERS: pytest-xdist workers for `test` (default 2, a test file per worker at a time;
# 0: one process), unless the arguments choose (-n, --numprocesses, -p no:xdist).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${DEV_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
# The suite's multi-rank tests wait on deadlines and peers as much as they compute, so two
# workers on 2 cores beat one (1,754 tests: 17.6 minutes with two, measured 2026-11-29).
TEST_WORKERS="${TEST_WORKERS:-2}"
STAMP="$VENV/.tokenring-xdit-install-stamp"

log() { printf 'dev.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

torch_version() {
    "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null
}

ensure_venv() {
    if [[ ! -x "$PY" ]]; then
        log "creating $VENV"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
}

ensure_torch() {
    if ! torch_version >/dev/null; then
        log "torch does not import in $VENV: installing $TORCH_SPEC"
        "$PY" -m pip install "$TORCH_SPEC"
        torch_version >/dev/null || die "torch still does not import after installing $TORCH_SPEC"
    fi
}

# What the editable install depends on: the project metadata, where the checkout is, the Python.
install_stamp() {
    {
        sha256sum "$ROOT/pyproject.toml"
        echo "$ROOT"
        "$PY" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

installed_here() {
    # The package must import from this checkout (run from / so the cwd cannot shadow it).
    [[ -x "$VENV/bin/tokenring-xdit" ]] && (cd / && "$PY" -c "
import os, sys, tokenring_xdit
sys.exit(os.path.realpath(tokenring_xdit.__file__) != '$ROOT/tokenring_xdit/__init__.py')
" 2>/dev/null)
}

ensure_project() {
    local want before after
    want="$(install_stamp)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && installed_here; then
        return 0
    fi
    rm -f "$STAMP"
    before="$(torch_version)"
    log "installing the project (editable, test extras) next to torch $before"
    (cd "$ROOT" && "$PY" -m pip install -e '.[test]')
    after="$(torch_version)" || die "torch no longer imports after pip install -e '.[test]'"
    if [[ "$before" != "$after" ]]; then
        die "pip install -e '.[test]' replaced torch $before with $after; reinstall it" \
            "(TORCH_SPEC=torch==$before) and make the dependency that asked for it accept $before"
    fi
    echo "$want" >"$STAMP"
}

main() {
    [[ $# -ge 1 ]] || usage
    local cmd="$1"
    shift
    case "$cmd" in
    run | test) ;;
    -h | --help | help) usage ;;
    *)
        log "unknown subcommand: $cmd"
        usage
        ;;
    esac
    ensure_venv
    ensure_torch
    ensure_project
    cd "$ROOT"
    if [[ "$cmd" == run ]]; then
        exec "$VENV/bin/tokenring-xdit" "$@"
    fi
    # The whole suite unless the arguments name test paths themselves (`test tests/unit -x`).
    local targets=(tests) arg
    for arg in "$@"; do
        if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
            targets=()
            break
        fi
    done
    local workers=(-n "$TEST_WORKERS" --dist loadfile)
    [[ "$TEST_WORKERS" == 0 ]] && workers=()
    for arg in "$@"; do
        case "$arg" in
        -n | -n* | --numprocesses* | no:xdist) workers=() ;;
        esac
    done
    exec "$PY" -m pytest -q ${workers[@]+"${workers[@]}"} ${targets[@]+"${targets[@]}"} "$@"
}

main "$@"
