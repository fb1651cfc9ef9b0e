#!/usr/bin/env bash
# scripts/gpu-steps on a machine without a GPU: every step is reported skipped with its
# reason (no GPU, or not built), the run exits 0 and writes a summary.json that parses, with
# the device line and one entry per step. (On a GPU machine the steps run: exit 77, skipped.)
#   gpu_run_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: gpu_run_test.sh SOURCE_DIR BUILD_DIR}; build=${2:?usage: gpu_run_test.sh SOURCE_DIR BUILD_DIR}
if [ -e /dev/nvidia0 ]; then echo "gpu_run_test: this machine has a GPU; the steps would run"; exit 77; fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# A bundle as scripts/gpu-run packs it: the GPU programs this build has, and a run wrapper.
mkdir -p "$work/bundle/bin" "$work/bundle/lib"
find "$build" -type f -perm -u+x -name '*gpu*' ! -path '*/CMakeFiles/*' -exec cp {} "$work/bundle/bin/" \;
[ -e "$build/preload/libcxlkv_preload.so" ] && cp -L "$build/preload/libcxlkv_preload.so" "$work/bundle/lib/"
printf '#!/usr/bin/env bash\nhere=$(cd "$(dirname "$0")" && pwd)\nexport PATH="$here/bin:$PATH"\nexec "$@"\n' >"$work/bundle/run"
chmod +x "$work/bundle/run"
rc=0
"$src/scripts/gpu-steps" "$work/bundle" "$work/out" 60 >"$work/log" 2>&1 || rc=$?
cat "$work/log"
[ "$rc" -eq 0 ] || { echo "FAIL: gpu-steps exited $rc without a GPU"; exit 1; }
/usr/bin/python3 - "$work/out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
names = [st["step"] for st in s["steps"]]
want = ["gpu_test", "capi_gpu_test", "preload_gpu_engine", "gpu_benchmark", "gpu_test_big"]
assert names == want, f"steps {names}, expected {want}"
for st in s["steps"]:
    assert st["status"] == "skipped", f"{st['step']} was {st['status']} on a machine without a GPU"
    assert st["detail"], f"{st['step']} skipped without a reason"
    assert "no NVIDIA GPU" in st["detail"] or "not in the bundle" in st["detail"], st
assert "gpu: none" in s["device"], s["device"]
print(f"gpu_run_test: {len(names)} steps skipped, each with its reason")
PY
