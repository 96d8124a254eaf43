#!/bin/bash
# usage: tests/gpu/prepare.sh
#
# Run on a machine with network access before tests/gpu/run.sh goes to a GPU
# machine that has none. Fills tests/gpu/deps/ (ignored by git, < 2 MiB):
#   debs/         libgloo-dev, libgloo0 and the runtime libraries libgloo0 needs
#                 beyond the C/C++ runtime (apt-get download; nothing is installed)
#   xla_include/  xla/ffi/ headers of jaxlib $JAXLIB_VERSION (the GPU image's jax),
#                 taken from the cp312 manylinux x86_64 wheel
#   wheels/       pure-Python wheels bagua_jax and its GPU tests need that the
#                 image may lack (optax and its dependencies); run.sh unpacks
#                 only those the image's Python cannot import
# Files already there are kept, so a second run needs no network.
# Exit status: 0 done, 1 a download failed.
set -euo pipefail

JAXLIB_VERSION=${JAXLIB_VERSION:-0.11.2}
PURE_WHEELS="optax chex toolz absl-py typing_extensions"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEPS=$HERE/deps
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
# Always on the GPU image (and every Debian/Ubuntu system): not downloaded.
BASE_PACKAGES=" libc6 libgcc-s1 libstdc++6 adduser debconf "

log() { echo "prepare: $*" >&2; }

# The package and its Depends, recursively, minus BASE_PACKAGES.
runtime_closure() {
  local queue=("$@") seen=" " pkg dep
  while ((${#queue[@]})); do
    pkg=${queue[0]}
    queue=("${queue[@]:1}")
    [[ $seen == *" $pkg "* || $BASE_PACKAGES == *" $pkg "* ]] && continue
    seen+="$pkg "
    echo "$pkg"
    for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                   --no-replaces --no-enhances "$pkg" | awk '$1 == "Depends:" {print $2}' | grep -v '^<'); do
      queue+=("$dep")
    done
  done
}

download_debs() {
  local dir=$DEPS/debs
  if ls "$dir"/libgloo-dev_*.deb "$dir"/libgloo0_*.deb >/dev/null 2>&1 && [ -f "$dir/PACKAGES" ]; then
    log "debs already there: $(tr '\n' ' ' <"$dir/PACKAGES")"
    return
  fi
  if ! apt-cache show libgloo0 >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { log "apt knows no libgloo0; run apt-get update as root"; return 1; }
    apt-get update -qq
  fi
  mkdir -p "$dir"
  local packages
  packages=$(runtime_closure libgloo0 | sort -u | tr "\n" " ")
  log "downloading libgloo-dev $packages"
  (cd "$dir" && apt-get download -q libgloo-dev $packages 2>&1 | { grep -v "^W: Download is performed unsandboxed" || true; } >&2)
  printf '%s\n' libgloo-dev $packages >"$dir/PACKAGES"
}

download_xla_headers() {
  local dir=$DEPS/xla_include
  if [ -f "$dir/xla/ffi/api/ffi.h" ]; then
    log "XLA FFI headers already there ($(cat "$dir/VERSION" 2>/dev/null))"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  log "downloading jaxlib $JAXLIB_VERSION (cp312 manylinux x86_64) for its XLA FFI headers"
  "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_27_x86_64 \
    -d "$tmp" "jaxlib==$JAXLIB_VERSION"
  "$PYTHON" - "$tmp"/jaxlib-*.whl "$dir" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "jaxlib/include/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix + "xla/ffi/") and not n.endswith("/")]
    if not names:
        sys.exit(f"{wheel} holds no {prefix}xla/ffi/")
    for n in names:
        info = z.getinfo(n)
        info.filename = n[len(prefix):]
        z.extract(info, dest)
EOF
  echo "jaxlib $JAXLIB_VERSION" >"$dir/VERSION"
}

download_python_wheels() {
  local dir=$DEPS/wheels
  if ls "$dir"/optax-*.whl >/dev/null 2>&1; then
    log "Python wheels already there"
    return
  fi
  mkdir -p "$dir"
  log "downloading $PURE_WHEELS"
  "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    --python-version 3.12 -d "$dir" $PURE_WHEELS
}

download_debs
download_xla_headers
download_python_wheels
log "done: $(du -sh "$DEPS" | cut -f1) in $DEPS"
