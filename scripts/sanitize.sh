#!/usr/bin/env bash
# Build the extension with AddressSanitizer and UndefinedBehaviorSanitizer and run the kernel,
# API, thread and fork tests on it. Any finding aborts the test process: the run is clean or
# it fails. Uses the Python environment ./install.sh set up (run that first).
#
#   bash scripts/sanitize.sh [pytest arguments]     (default: the subset below)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY=$ROOT/.venv/bin/python
WORK=$ROOT/build/sanitize
mkdir -p "$WORK"

# The kernel backends of the recipe this machine builds (the same the tests expect of it).
BACKENDS=$("$PY" -m ktforge build --plan --json | "$PY" -c 'import json, sys; print(";".join(json.load(sys.stdin)["kernel_backends"]))')
echo "==> building the extension ($BACKENDS) with -fsanitize=address,undefined (log: $WORK/build.log)"
rm -rf "$WORK/dist"
if ! "$PY" -m pip wheel --no-deps --disable-pip-version-check -w "$WORK/dist" \
    --config-settings=build-dir="$WORK/cmake" \
    --config-settings=cmake.define.KTFORGE_SANITIZE=address,undefined \
    "--config-settings=cmake.define.KTFORGE_BACKENDS=$BACKENDS" \
    "$ROOT" >"$WORK/build.log" 2>&1; then
  tail -n 30 "$WORK/build.log" >&2
  echo "sanitize.sh: the instrumented build failed; the full log is $WORK/build.log" >&2
  exit 1
fi

# Its own environment: the instrumented ktforge in front, everything else from the base one.
rm -rf "$WORK/venv"
"$PY" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed --disable-pip-version-check \
  "$WORK"/dist/ktforge-*.whl

# Python itself is not instrumented: the ASan runtime must be loaded first, and libstdc++ with
# it (Python does not link it, and ASan's __cxa_throw interceptor needs the real one at start).
# Leaks are the interpreter's business (detect_leaks=0); everything else is fatal. No alternate
# signal stacks (use_sigaltstack=0): ASan maps one in each new thread and aborts when that mmap
# fails, so under test_concurrency's RLIMIT_AS a thread the system refuses would abort the process
# about one run in seven, where the product's path (pthread_create's EAGAIN, a RuntimeError) is
# what the test checks.
ASAN_LIB=$(readlink -f "$(${CXX:-g++} -print-file-name=libasan.so)")
STDCXX_LIB=$(readlink -f "$(${CXX:-g++} -print-file-name=libstdc++.so)")
export LD_PRELOAD="$ASAN_LIB $STDCXX_LIB"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_init_order=1:use_sigaltstack=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export KTFORGE_EXPECT_SANITIZED=1
cd "$ROOT"
if [ $# = 0 ]; then
  # Less the outlier-accuracy sweep (two magnitudes x every int8-activation format x backend, 80%
  # of the kernel tests' time, 7 of ASan's 9 minutes): it measures errors on the code paths that
  # test_moe_correctness and the per-token test below already run here
  set -- tests/kernels tests/checkpoints/test_convert.py \
    tests/detect/test_extension.py::test_the_build_is_instrumented_exactly_in_the_sanitizer_run \
    --deselect tests/kernels/test_activation_blocks.py::test_outlier_channels_cost_only_their_own_blocks \
    -q -p no:cacheprovider
fi
echo "==> the kernel, API, thread and fork tests on it"
"$WORK/venv/bin/python" -m pytest "$@"
