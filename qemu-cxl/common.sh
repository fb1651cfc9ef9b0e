# shellcheck shell=bash
# Host-side helpers shared by qemu-cxl/build-guest and qemu-cxl/run (sourced, not run).
#
# Sets QEMU_CXL_DIR (this directory), REPO_ROOT and CACHE_DIR (CXLKV_QEMU_CACHE, default
# build/qemu-cxl under the repository root).

QEMU_CXL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$QEMU_CXL_DIR/.." && pwd)"
# shellcheck disable=SC2034  # used by the scripts that source this
CACHE_DIR="${CXLKV_QEMU_CACHE:-$REPO_ROOT/build/qemu-cxl}"

say() { printf 'qemu-cxl: %s\n' "$*" >&2; }
die() { printf 'qemu-cxl: error: %s\n' "$*" >&2; exit 1; }

# need CMD PACKAGE: fail with the Debian package to install when CMD is missing.
need() {
  command -v "$1" >/dev/null 2>&1 || [ -x "$1" ] ||
    die "'$1' not found: install the Debian package '$2' (scripts/deps does)"
}
