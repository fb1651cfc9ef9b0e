#!/usr/bin/env bash
# Installs a build tree into a temporary prefix and uses it the way a user would:
#   1. `cmake --install <build> --prefix $tmp`; every installed piece is where
#      cmake/CxlkvInstall.cmake says (libcxlkv.so with its SONAME links, cxlkv.h, the preload
#      shim, LMCache's visibility library, cxlkvctl, cxlkv-orchestrator, the systemd unit,
#      cxlkv.pc, the CMake package), and nothing installed points back into the build tree;
#      the shim starts its heap and the visibility library answers a ctypes call;
#   2. builds consumer/main.c with `pkg-config --cflags --libs cxlkv` and runs it
#      (LD_LIBRARY_PATH = pkg-config's libdir);
#   3. configures consumer/ (find_package(cxlkv) -> cxlkv::cxlkv) with CMAKE_PREFIX_PATH and
#      runs what it builds (found through the build RPATH CMake gives it).
#   4. (with a Python package directory, the 8th argument) imports the installed Python package
#      with Debian's /usr/bin/python3 from outside the tree, CXLKV_LIBRARY unset, and checks it
#      loaded the prefix's libcxlkv.so.0 (through _install_paths.py) and that
#      `python -m cxlkv status` reports it.
# The consumer opens a memfd pool, formats an arena, allocates, writes, reads back and frees a
# block through the C API, and fails unless libcxlkv was loaded from the prefix.
# Usage: run.sh <build dir> <libdir> <bindir> <includedir> <cmake> <C compiler> <pkg-config>
#               [<python package dir>]
#   (the directories relative to the prefix, as GNUInstallDirs named them for this build)
set -euo pipefail
if [[ $# -ne 7 && $# -ne 8 ]]; then
  echo "usage: $0 <build dir> <libdir> <bindir> <includedir> <cmake> <cc> <pkg-config> [<pydir>]" >&2
  exit 2
fi
build=$1 libdir=$2 bindir=$3 includedir=$4 cmake=$5 cc=$6 pkgconfig=$7 pydir=${8:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cxlkv-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "install test: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install failed (are all targets built? cmake --build $build)"; }

L=$prefix/$libdir B=$prefix/$bindir I=$prefix/$includedir
for f in "$L/libcxlkv.so" "$L/libcxlkv.so.0" "$I/cxlkv/cxlkv.h" "$L/libcxlkv_preload.so" \
         "$L/liblmcache_shared_l1_visibility.so" "$I/cxlkv/lmcache/visibility.h" \
         "$B/cxlkvctl" "$B/cxlkv-orchestrator" "$prefix/lib/systemd/system/cxlkv-orchestrator@.service" \
         "$L/pkgconfig/cxlkv.pc" "$L/cmake/cxlkv/cxlkvConfig.cmake" \
         "$L/cmake/cxlkv/cxlkvConfigVersion.cmake" "$L/cmake/cxlkv/cxlkvTargets.cmake"; do
  [[ -e $f ]] || fail "${f#"$prefix"/} is not installed"
done
# The SONAME chain: libcxlkv.so -> libcxlkv.so.0 -> the real file, whose SONAME is libcxlkv.so.0.
[[ -L $L/libcxlkv.so && $(readlink "$L/libcxlkv.so") == libcxlkv.so.0 ]] ||
  fail "$libdir/libcxlkv.so is not a link to libcxlkv.so.0"
real=$(readlink -f "$L/libcxlkv.so.0")
[[ -f $real && ! -L $real ]] || fail "$libdir/libcxlkv.so.0 does not lead to a file"
readelf -d "$real" | grep -q 'SONAME.*\[libcxlkv\.so\.0\]' || fail "$real has no SONAME libcxlkv.so.0"
# Installed files must not reach into the build tree (RPATH/RUNPATH, the CMake package).
build_abs=$(cd "$build" && pwd -P)
for f in "$real" "$L/libcxlkv_preload.so" "$L/liblmcache_shared_l1_visibility.so" \
         "$B/cxlkvctl" "$B/cxlkv-orchestrator"; do
  if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -qF "$build_abs"; then
    fail "${f#"$prefix"/} keeps an RPATH into the build tree: $(readelf -d "$f" | grep -E 'R(UN)?PATH')"
  fi
done
if grep -rqF "$build_abs" "$L/cmake/cxlkv" "$L/pkgconfig/cxlkv.pc"; then
  fail "the CMake package or cxlkv.pc names the build tree"
fi
# The unit starts the installed daemon.
grep -qx "ExecStart=$B/cxlkv-orchestrator --config /etc/cxlkv/%i.toml" \
  "$prefix/lib/systemd/system/cxlkv-orchestrator@.service" ||
  fail "the systemd unit does not start $B/cxlkv-orchestrator"
# The programs and the shim load from the prefix.
"$B/cxlkvctl" --help >/dev/null || fail "$bindir/cxlkvctl --help failed"
"$B/cxlkv-orchestrator" --help >/dev/null || fail "$bindir/cxlkv-orchestrator --help failed"
out=$(LD_PRELOAD=$L/libcxlkv_preload.so CXLKV_POOL=memfd:install-test?size=64M \
        CXLKV_LOG=info sh -c 'echo shim-ok' 2>&1) ||
  fail "a program under the installed shim failed: $out"
[[ $out == *"CXL heap:"* && $out == *shim-ok* ]] ||
  fail "the installed shim did not start its CXL heap: $out"
# LMCache's visibility library, loaded as LMCache loads it (ctypes, absolute path).
/usr/bin/python3 - "$L/liblmcache_shared_l1_visibility.so" <<'PY' ||
import ctypes, mmap, os, sys
lib = ctypes.CDLL(sys.argv[1], use_errno=True)
f = lib.lmcache_shared_l1_visibility_v1
f.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64,
              ctypes.c_size_t, ctypes.c_uint64]
f.restype = ctypes.c_int
fd = os.memfd_create("install-test")
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
addr = ctypes.addressof(ctypes.c_ubyte.from_buffer(m))
sys.exit(f(b"software_fenced", 1, fd, addr, 0, 4096, 1) or f(b"software_fenced", 2, fd, addr, 0, 4096, 1))
PY
  fail "the installed liblmcache_shared_l1_visibility.so cannot be loaded and called with ctypes"

echo "== pkg-config --cflags --libs cxlkv"
export PKG_CONFIG_PATH=$L/pkgconfig
cflags=$("$pkgconfig" --cflags cxlkv) && libs=$("$pkgconfig" --libs cxlkv) ||
  fail "pkg-config cannot find cxlkv in $L/pkgconfig"
pc_libdir=$("$pkgconfig" --variable=libdir cxlkv)
echo "   $cflags $libs"
# shellcheck disable=SC2086  # the flags are words
"$cc" -std=c11 -Wall -Wextra -Werror $cflags "$here/consumer/main.c" -o "$tmp/consumer-pc" \
  $libs -ldl || fail "the C program does not build against the installed cxlkv (pkg-config)"
LD_LIBRARY_PATH=$pc_libdir "$tmp/consumer-pc" "$L" ||
  fail "the C program built with pkg-config failed"

echo "== find_package(cxlkv) with CMAKE_PREFIX_PATH=$prefix"
"$cmake" -S "$here/consumer" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log" >&2; fail "find_package(cxlkv) does not configure"; }
"$cmake" --build "$tmp/consumer-build" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log" >&2; fail "the CMake consumer does not build"; }
"$tmp/consumer-build/consumer" "$L" || fail "the C program built with find_package failed"

if [[ -n $pydir ]]; then
  echo "== the Python package in $prefix/$pydir"
  P=$prefix/$pydir/cxlkv
  for f in "$P/__init__.py" "$P/py.typed" "$P/_install_paths.py" "$P/integrations/check.py"; do
    [[ -e $f ]] || fail "${f#"$prefix"/} is not installed"
  done
  if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    echo "   skipped the import: /usr/bin/python3 has no numpy (apt-get install python3-numpy)"
  else
    # From an empty directory, so nothing of the source tree is importable.
    out=$(cd "$tmp" && env -u CXLKV_LIBRARY PYTHONPATH="$prefix/$pydir" /usr/bin/python3 -c \
          'import cxlkv; l = cxlkv.library(); print(cxlkv.__file__); print(l.realpath); print(l.how)') ||
      fail "the installed Python package does not import"
    [[ $(sed -n 1p <<<"$out") == "$P/__init__.py" ]] || fail "imported cxlkv from elsewhere: $out"
    [[ $(sed -n 2p <<<"$out") == "$(readlink -f "$L/libcxlkv.so.0")" ]] ||
      fail "the installed package loaded another libcxlkv: $out"
    [[ $(sed -n 3p <<<"$out") == "cmake --install" ]] || fail "found the library by: $out"
    # The distribution and its entry points, as importlib.metadata (vLLM's plugin loader)
    # lists them.
    eps=$(cd "$tmp" && env -u CXLKV_LIBRARY PYTHONPATH="$prefix/$pydir" /usr/bin/python3 -c \
          'from importlib.metadata import distribution, entry_points as e
print(distribution("cxlkv").version)
print([(x.name, x.value) for x in e(group="vllm.general_plugins") if x.name == "cxlkv"])') ||
      fail "importlib.metadata does not find the installed distribution: $eps"
    [[ $(sed -n 2p <<<"$eps") == "[('cxlkv', 'cxlkv.integrations.vllm:register_plugin')]" ]] ||
      fail "the vllm.general_plugins entry point is not listed: $eps"
    # Whole output first: `| grep -q` would stop reading at the match, and the CLI's next
    # write would then fail with a broken pipe.
    status=$(cd "$tmp" && env -u CXLKV_LIBRARY PYTHONPATH="$prefix/$pydir" /usr/bin/python3 -m cxlkv \
      status) || fail "python -m cxlkv status failed: $status"
    grep -qF "$(readlink -f "$L/libcxlkv.so.0")" <<<"$status" ||
      fail "python -m cxlkv status does not report it: $status"
  fi
fi

echo "install test: passed"
