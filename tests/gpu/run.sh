#!/bin/bash
# usage: tests/gpu/run.sh OUTDIR [--dry-run]
#
# Builds bagua_core._C with this machine's Python and runs every GPU test and GPU
# benchmark, for a lent GPU machine without network (see tests/gpu/README.md).
# Needs tests/gpu/deps/ from tests/gpu/prepare.sh (Gloo's Debian packages, the
# jaxlib XLA FFI headers). Never installs anything, never calls make or pip.
#
# Steps, each with its own log OUTDIR/STEP.log and a time limit (the whole run
# stays under BAGUA_GPU_TOTAL_S, 450 s by default); a failed step is recorded and
# the next one runs. OUTDIR/summary.txt lists each step: pass/fail, seconds.
#   env         tool and library versions (and nvidia-smi)
#   pylibs      unpack the pure-Python wheels of deps/wheels whose module the
#               machine's Python cannot import into BUILD/pylib (on PYTHONPATH)
#   gloo        unpack the debs into BUILD/gloo-prefix (never over /), point the
#               packaged CMake config into it, link the libraries this system
#               lacks into BUILD/gloo-prefix/lib-extra (on LD_LIBRARY_PATH)
#   configure   plain CMake + Ninja in BUILD/cmake: architecture 90, no LTO
#   build       the module lands in bagua_core/, so `import bagua_core` works here
#   import      import bagua_core._C from the repo root (and count the GPUs)
#   gpu_tests   python -m pytest -m gpu tests/
#   bench_NAME  python benchmarks/gpu_NAME.py, one step each (none is fine)
#
# --dry-run stops short of the first CUDA call, for machines without a GPU: the
# same build (with the FFI compiled against deps/xla_include, the GPU image's
# jaxlib headers), the import, pytest --collect-only, the benchmark list
# (byte-compiled). tests/core/test_gpu_script.py runs it.
#
# Environment: PYTHON (default python3), BAGUA_GPU_BUILD_DIR (default
# REPO/build/gpu), BAGUA_GPU_TOTAL_S. Exit status 0 when every step passed.
set -uo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/../.." && pwd)
DEPS=$REPO/tests/gpu/deps
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
BUILD=${BAGUA_GPU_BUILD_DIR:-$REPO/build/gpu}
PREFIX=$BUILD/gloo-prefix
EXTRA_LIBS=$PREFIX/lib-extra

PYLIB=$BUILD/pylib
export PYTHON PYTHONPATH=$REPO:$PYLIB CCACHE_BASEDIR=$REPO
export LD_LIBRARY_PATH=$EXTRA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d /usr/local/cuda/bin ] && export PATH=$PATH:/usr/local/cuda/bin

# ---------------------------------------------------------------- steps
# Each runs in its own process (run.sh --step NAME) under `timeout`, in REPO,
# with set -e; DRY=1 in a dry run, OUTDIR set.

step_env() {
  echo "repo: $REPO  build: $BUILD  python: $PYTHON"
  "$PYTHON" - <<'EOF'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for name in ("torch", "jax", "jaxlib", "cupy", "pybind11", "pytest", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # report, do not fail: the steps that need it will
        print(name, "not importable:", e)
EOF
  cmake --version | head -1
  echo "ninja $(ninja --version)"
  nvcc --version | tail -2
  command -v ccache >/dev/null && ccache --version | head -1 || echo "no ccache"
  if [ "$DRY" = 0 ]; then nvidia-smi; fi
}

step_pylibs() {
  local wheel module
  mkdir -p "$PYLIB"
  for wheel in "$DEPS"/wheels/*.whl; do
    [ -e "$wheel" ] || { echo "no wheels in $DEPS/wheels: run tests/gpu/prepare.sh first"; return 1; }
    module=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z' 'a-z')
    [ "$module" = absl_py ] && module=absl
    if PYTHONPATH=$REPO "$PYTHON" -c "import $module" 2>/dev/null; then
      echo "$module: the machine's own"
    else
      echo "$module: from $(basename "$wheel")"
      "$PYTHON" -m zipfile -e "$wheel" "$PYLIB"
    fi
  done
}

step_gloo() {
  local debs=("$DEPS"/debs/*.deb) stamp
  [ -e "${debs[0]}" ] || { echo "no debs in $DEPS/debs: run tests/gpu/prepare.sh first"; return 1; }
  stamp=$(cksum "${debs[@]}" "$SELF")  # unpack again when the debs or this script change
  if [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for deb in "${debs[@]}"; do
      echo "unpacking $(basename "$deb")"
      dpkg-deb -x "$deb" "$PREFIX"
    done
    # The packaged targets name /usr/lib/libgloo.so.* by absolute path.
    sed -i "s|\"/usr/lib/|\"$PREFIX/usr/lib/|g" "$PREFIX"/usr/share/cmake/Gloo/GlooTargets-*.cmake
    link_missing_libs
    echo "$stamp" >"$PREFIX/.stamp"
  fi
  if grep -n '"/usr/lib/' "$PREFIX"/usr/share/cmake/Gloo/*.cmake; then echo "unpatched path"; return 1; fi
  grep -h "IMPORTED_LOCATION" "$PREFIX"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  ls -l "$EXTRA_LIBS"
}

# Only the libraries the system's loader cannot find go on LD_LIBRARY_PATH, so the
# image's own libibverbs (and the rest) stay in use where it has them.
link_missing_libs() {
  local known lib name
  known=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | awk '{print $1}')
  mkdir -p "$EXTRA_LIBS"
  for lib in "$PREFIX"/{usr/,}lib/{,*/}*.so.*; do
    [ -e "$lib" ] || continue
    name=$(basename "$lib")
    grep -qxF "$name" <<<"$known" || ln -sf "$lib" "$EXTRA_LIBS/$name"
  done
}

step_configure() {
  local args=(-S "$REPO" -B "$BUILD/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DPython_EXECUTABLE="$PYTHON" -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)"
    -DGloo_DIR="$PREFIX/usr/share/cmake/Gloo"
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF)
  if command -v ccache >/dev/null; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  if [ "$DRY" = 1 ]; then
    args+=(-DBAGUA_XLA_INCLUDE_DIR="$DEPS/xla_include")  # the GPU image's jaxlib
  else
    args+=(-DBAGUA_XLA_INCLUDE_DIR=)  # this machine's jax
  fi
  cmake "${args[@]}" | tee "$BUILD/configure.out"
  grep -q "bagua: building XLA FFI handlers" "$BUILD/configure.out" || { echo "FFI handlers not configured"; return 1; }
  grep -q "bagua: building CUDA kernels" "$BUILD/configure.out" || { echo "CUDA not configured"; return 1; }
  grep "^Gloo_DIR" "$BUILD/cmake/CMakeCache.txt"
}

step_build() {
  cmake --build "$BUILD/cmake" -j "$(nproc)"
  ls -l "$REPO"/bagua_core/_C*.so
}

step_import() {
  "$PYTHON" - <<'EOF'
import os
import bagua_core
from bagua_core import _C, _nccl
where = os.path.dirname(os.path.abspath(_C.__file__))
print("module", _C.__file__)
assert where == os.path.join(os.getcwd(), "bagua_core"), f"imported {_C.__file__}, not this tree's"
assert _C.has_xla_ffi, "built without the XLA FFI handlers"
print("XLA FFI targets:", {p: sorted(t) for p, t in _C.ffi_targets().items()})
try:
    print("NCCL library:", _nccl.find_library())
except _nccl.NcclNotFoundError as e:
    if os.environ["DRY"] == "0":
        raise
    print("NCCL library: none here:", e)
if os.environ["DRY"] == "0":
    print("CUDA driver", _C.cuda_driver_version(), "runtime", _C.cuda_runtime_version())
    n = _C.cuda_device_count()
    print("CUDA devices:", n, "" if n else _C.cuda_unavailable_reason())
    assert n > 0, "no CUDA device visible"
EOF
}

step_gpu_tests() {
  if [ "$DRY" = 1 ]; then
    "$PYTHON" -m pytest -p no:cacheprovider -m gpu tests/ --collect-only -q
  else
    "$PYTHON" -m pytest -p no:cacheprovider -m gpu tests/ -q -ra --junitxml="$OUTDIR/gpu_tests.xml" |
      tee "$BUILD/gpu_tests.out"
    # on a GPU machine, everything skipping is a failure too
    grep -qE "[0-9]+ passed" "$BUILD/gpu_tests.out" || { echo "every GPU test skipped"; return 1; }
  fi
}

step_bench() {  # FILE
  "$PYTHON" "$1"
}

step_benchmarks() {  # dry run: what the real run would start
  local files=(benchmarks/gpu_*.py)
  [ -e "${files[0]}" ] || { echo "no benchmarks/gpu_*.py"; return 0; }
  printf '%s\n' "${files[@]}"
  "$PYTHON" -m py_compile "${files[@]}"
}

# ---------------------------------------------------------------- driver

# An editable install of some tree (pip install -e ., scikit-build-core) maps
# bagua_core there ahead of PYTHONPATH; its finder steps aside for the build
# folders listed in SKBUILD_EDITABLE_SKIP.
skip_editable_installs() {
  local paths
  paths=$("$PYTHON" -c 'import sys; print(":".join(getattr(f, "path", "") for f in sys.meta_path
                          if type(f).__module__.startswith("_editable_skbc")))' 2>/dev/null) || return 0
  [ -n "$paths" ] && export SKBUILD_EDITABLE_SKIP=$paths${SKBUILD_EDITABLE_SKIP:+:$SKBUILD_EDITABLE_SKIP}
  return 0
}


record() {  # NAME RESULT SECONDS NOTE
  printf '%-26s %-4s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$OUTDIR/summary.txt"
  [ "$2" = pass ] || FAILED=$((FAILED + 1))
}

run_step() {  # NAME CAP_S [ARG]  (CAP_S applies to real runs; a dry run has only the total)
  local name=$1 cap=$2 arg=${3:-} left limit start rc note
  left=$((DEADLINE - $(date +%s)))
  limit=$left
  if [ "$DRY" = 0 ] && [ "$cap" -lt "$left" ]; then limit=$cap; fi
  if [ "$limit" -le 0 ]; then record "$name" fail 0 "not started: no time left"; return; fi
  start=$(date +%s)
  timeout -k 10 "$limit" bash "$SELF" --step "$name" "$arg" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  note="rc=$rc"
  [ $rc = 124 ] || [ $rc = 137 ] && note="timed out after ${limit}s"
  [ "$name" = gpu_tests ] && note="$note; $(grep -E '^[= ]*[0-9]+ (passed|failed|skipped|errors?|deselected)|tests? collected|no tests ran' "$OUTDIR/$name.log" | tail -1)"
  record "$name" "$([ $rc = 0 ] && echo pass || echo fail)" $(($(date +%s) - start)) "$note"
}

main() {
  if [ "${1:-}" = --step ]; then  # one step, in its own process
    set -e
    cd "$REPO"
    case $2 in bench_*) step_bench "$3" ;; *) "step_$2" ;; esac
    return
  fi
  [ $# -ge 1 ] && [ "$1" != --dry-run ] || { sed -n '2,3p' "$SELF"; return 2; }
  OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
  DRY=0
  [ "${2:-}" = --dry-run ] && DRY=1
  export OUTDIR DRY
  if [ "$DRY" = 1 ]; then
    DEADLINE=$(($(date +%s) + ${BAGUA_GPU_TOTAL_S:-1080}))
    export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  else
    DEADLINE=$(($(date +%s) + ${BAGUA_GPU_TOTAL_S:-450}))
    export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu} XLA_PYTHON_CLIENT_PREALLOCATE=false
  fi
  FAILED=0
  mkdir -p "$BUILD"
  skip_editable_installs
  {
    echo "bagua tests/gpu/run.sh $([ "$DRY" = 1 ] && echo --dry-run)  $(date -u +%FT%TZ)  $(hostname)"
    echo "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)  python $PYTHON"
  } | tee "$OUTDIR/summary.txt"

  run_step env 30
  run_step pylibs 30
  run_step gloo 30
  run_step configure 90
  run_step build 240
  run_step import 30
  run_step gpu_tests 240
  if [ "$DRY" = 1 ]; then
    run_step benchmarks 30
  else
    local bench
    for bench in "$REPO"/benchmarks/gpu_*.py; do
      [ -e "$bench" ] || continue
      run_step "bench_$(basename "$bench" .py)" 120 "$bench"
    done
  fi
  echo "result: $([ $FAILED = 0 ] && echo "all steps passed" || echo "$FAILED step(s) failed")" | tee -a "$OUTDIR/summary.txt"
  [ $FAILED = 0 ]
}

main "$@"
