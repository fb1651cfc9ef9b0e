#!/usr/bin/env bash
# The GPU kit's dry run (docs/gpu.md "The GPU kit"), so the kit cannot rot between device
# lends: packs the GPU bundle from this build with scripts/gpu-run --pack (the packer the
# device run uses: programs and the shared libraries ldd finds), then runs scripts/gpu-steps
# from the bundle on this machine without a GPU. Every step must run its dry run from the
# bundle (gpu_test lists the tests it would run; gpu_benchmark prints the kit's plan for the
# device box the lent machines are: an H200 with 139 GiB free, 120 GiB of host memory, two
# NUMA nodes; the C API test and the engine under the shim start and report no device), the
# big registration be skipped with its reason; the run exits 0 and writes a summary.json and the
# plan's JSON, which must hold all three questions at the sizes that box allows.
# (On a GPU machine the steps would measure: exit 77, skipped.) Defined for builds with CUDA.
#   gpu_run_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: gpu_run_test.sh SOURCE_DIR BUILD_DIR}; build=${2:?usage: gpu_run_test.sh SOURCE_DIR BUILD_DIR}
if [ -e /dev/nvidia0 ]; then echo "gpu_run_test: this machine has a GPU; the steps would run"; exit 77; fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
build=$(cd "$build" && pwd)
"$src/scripts/gpu-run" --pack "$build" "$work/bundle"
for f in run steps; do [ -x "$work/bundle/$f" ] || [ -f "$work/bundle/$f" ] || { echo "FAIL: bundle lacks $f"; exit 1; }; done
# Every program in the bundle finds its libraries there or in the C runtime (what the device
# machine, which has no Debian packages, will do).
for p in "$work/bundle/bin/"*; do
  if LD_LIBRARY_PATH="$work/bundle/lib" ldd "$p" | grep -q "not found"; then
    echo "FAIL: $p: a library is not in the bundle:"; LD_LIBRARY_PATH="$work/bundle/lib" ldd "$p" | grep "not found"; exit 1
  fi
done
rc=0
CXLKV_GPU_KIT_MACHINE="device_free_gib=139,host_gib=120,cpus=16,gpu_node=0,nodes=0:58/1:60,name=H200" \
  bash "$work/bundle/steps" "$work/bundle" "$work/out" 360 >"$work/log" 2>&1 || rc=$?
cat "$work/log"
[ "$rc" -eq 0 ] || { echo "FAIL: gpu-steps exited $rc without a GPU"; exit 1; }
for p in gpu_benchmark gpu_test; do
  [ -x "$work/bundle/bin/$p" ] || { echo "FAIL: $build has CUDA but the bundle has no $p"; exit 1; }
done
/usr/bin/python3 - "$work/out" <<'PY'
import json, os, sys
out = sys.argv[1]
s = json.load(open(os.path.join(out, "summary.json")))
steps = {st["step"]: st for st in s["steps"]}
want = ["gpu_test", "capi_gpu_test", "preload_gpu_engine", "gpu_benchmark", "gpu_test_big"]
assert [st["step"] for st in s["steps"]] == want, f"steps {list(steps)}, expected {want}"
for name, st in steps.items():
    assert st["detail"], f"{name} {st['status']} without a reason"
    if name != "gpu_test_big":
        assert st["status"] == "dry-run", f"{name}: dry run {st['status']}: {st['detail']}"
    else:
        assert st["status"] == "skipped", f"{name} was {st['status']} on a machine without a GPU"
    assert "no NVIDIA GPU" in st["detail"] or "GiB free" in st["detail"], st
assert "gpu: none" in s["device"], s["device"]
log = open(os.path.join(out, "steps.log")).read()
assert "GpuTest." in log and "RegistersMemfdArena" in log, "gpu_test listed no tests"
plan = json.load(open(os.path.join(out, "gpu_kit_plan.json")))
cases = {c["name"]: c for c in plan["cases"]}
def status(n):
    assert n in cases, f"{n} not in the plan: {sorted(cases)[:20]}..."
    return cases[n]["status"]
assert plan["machine"]["device"] == "H200" and plan["copy_batch_bytes"] == 1 << 30, plan["machine"]
assert plan["remote_node"] == 1, plan["remote_node"]
# The three questions, at the sizes the box allows.
for n in ["Copy/h2d/hostalloc/2MiB", "Copy/h2d/arena/2MiB", "Copy/h2d/remote/2MiB",
          "Copy/h2d/arena/1GiB", "Copy/d2h/arena/1GiB", "Streams/arena/1", "Streams/arena/8",
          "Gather/kernel/contiguous/4KiB", "GatherBlocks64K/memcpy/separate/1024",
          "Register/chunked/8GiB", "Register/one-call/8GiB", "Register/chunked/64GiB",
          "RegisterUnderTraffic/8GiB", "WriteBack/16x8MiB"]:
    assert status(n) == "planned", f"{n}: {cases[n]}"
for n in ["Register/chunked/256GiB", "Register/one-call/256GiB"]:
    assert status(n) == "skipped" and "host memory" in cases[n]["why"], cases[n]
assert plan["planned_s"] <= plan["budget_s"], (plan["planned_s"], plan["budget_s"])
assert any(l.startswith("kit: skipped Register/chunked/256GiB") for l in plan["summary"]), plan["summary"]
print(f"gpu_run_test: bundle packed; {len(steps)} steps: "
      f"{', '.join(n + ' ' + st['status'] for n, st in steps.items())}; "
      f"kit plan {sum(c['status'] == 'planned' for c in plan['cases'])} cases "
      f"(~{plan['planned_s']:.0f} s of {plan['budget_s']:.0f}), "
      f"{sum(c['status'] == 'skipped' for c in plan['cases'])} skipped with their reasons")
PY
