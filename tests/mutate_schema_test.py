#!/usr/bin/python3
"""scripts/mutate-protocol's run-time switch (docs/mutation.md, "Behind a run-time switch"):
every mutant switched on by CXLKV_MUTANT behaves exactly as the same mutant built from its own
text edit, and with no mutant switched on the switched text behaves as the original.

A small C++ program with the call shapes the scan finds (a call statement on a receiver, one
spread over lines, a namespace-qualified one, a full fence that is also weakened, a streaming
copy that is also made a plain copy, a predicate inside a condition) prints the memory
operations it makes. Each mutant is compiled from its text edit and run; the switched text is
compiled once and run with each mutant's id; the two outputs must be equal, and every mutant
must differ from the original (or the comparison proves nothing).
Usage: mutate_schema_test.py [SOURCE_DIR]
"""
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))

SAMPLE = r"""#include <cstdio>
#include <cstring>
namespace coherence {
inline void Flush(const void*, unsigned long n) { std::printf("flush %lu\n", n); }
inline void Fence() { std::printf("sfence\n"); }
inline void CopyNt(void* d, const void* s, unsigned long n) {
  std::memcpy(d, s, n);
  std::printf("copy-nt %lu\n", n);
}
}  // namespace coherence
struct Mem {
  void Flush(unsigned long off, unsigned long n) { std::printf("mem.flush %lu %lu\n", off, n); }
  void Invalidate(unsigned long off) { std::printf("mem.invalidate %lu\n", off); }
  void Evict(unsigned long off) { std::printf("mem.evict %lu\n", off); }
  void Fence() { std::printf("mem.fence\n"); }
  void FullFence() { std::printf("mem.full-fence\n"); }
};
bool WriteAllowed(int term) { std::printf("gate %d\n", term); return term > 5; }

void Publish(Mem& mem, char* line) {
  mem.Flush(64,
            128);
  mem.FullFence();
  coherence::Flush(line, 64);
  if (WriteAllowed(3)) std::printf("wrote\n");
  char copy[8] = {0};
  coherence::CopyNt(copy, line, sizeof(copy));
  coherence::Fence();
  std::printf("copied %c\n", copy[0]);
}

int main() {
  Mem mem;
  char line[64];
  std::memset(line, 'x', sizeof(line));
  Publish(mem, line);
  mem.Invalidate(7);
  return 0;
}
"""


def load_tool():
    path = os.path.join(ROOT, "scripts", "mutate-protocol")
    loader = importlib.machinery.SourceFileLoader("mutate_protocol", path)
    spec = importlib.util.spec_from_loader("mutate_protocol", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def build_and_run(work, name, text, env=None):
    src = os.path.join(work, name + ".cc")
    exe = os.path.join(work, name)
    with open(src, "w", encoding="utf-8") as f:
        f.write(text)
    cxx = os.environ.get("CXX") or shutil.which("g++") or "c++"
    subprocess.run([cxx, "-std=c++20", "-O0", "-Wall", "-Werror", "-o", exe, src], check=True)
    run_env = dict(os.environ)
    run_env.pop("CXLKV_MUTANT", None)
    run_env.update(env or {})
    return subprocess.run([exe], env=run_env, capture_output=True, text=True,
                          check=True).stdout


def main():
    tool = load_tool()
    names = ["Flush", "Invalidate", "Evict", "Fence", "FullFence", "CopyNt"]
    sites, _ = tool.scan_file("sample.cc", SAMPLE, names, {"WriteAllowed": "true"})
    mutants = [m for st in sites for m in tool.mutants_of(st, SAMPLE)]
    ops = sorted({m.op for m in mutants})
    want_ops = ["drop", "force", "plain-copy", "weaken"]
    failures = []
    if ops != want_ops:
        failures.append(f"the sample's mutants cover {ops}, not {want_ops}")
    schema, text_only, texts = tool.plan_schema(mutants, {"sample.cc": SAMPLE})
    if text_only or len(schema) != len(mutants):
        failures.append(f"{len(text_only)} of {len(mutants)} mutants left to text edits")
    with tempfile.TemporaryDirectory(prefix="cxlkv-mutate-schema-") as work:
        original = build_and_run(work, "original", SAMPLE)
        switched_text = tool.IN_PLACE_PRAGMAS + tool.SCHEMA_HELPER + texts["sample.cc"]
        switched = os.path.join(work, "switched")
        build_and_run(work, "switched", switched_text)
        off = subprocess.run([switched], capture_output=True, text=True, check=True,
                             env={k: v for k, v in os.environ.items() if k != "CXLKV_MUTANT"})
        if off.stdout != original:
            failures.append("no mutant switched on: output differs from the original:\n"
                            f"{off.stdout}\nagainst\n{original}")
        for m in schema:
            by_text = build_and_run(work, f"text{m.schema_id}", m.new_text)
            by_switch = subprocess.run([switched], capture_output=True, text=True, check=True,
                                       env=dict(os.environ, CXLKV_MUTANT=str(m.schema_id))).stdout
            what = f"{m.key} (line {m.site.line}, switch {m.schema_id})"
            if by_text == original:
                failures.append(f"{what}: the text edit changes nothing the sample prints")
            if by_switch != by_text:
                failures.append(f"{what}: switched on, prints\n{by_switch}\nbuilt on its own, "
                                f"prints\n{by_text}")
            else:
                print(f"ok: {what}")
    if failures:
        print("\n".join(["FAIL:"] + failures))
        return 1
    print(f"mutate_schema_test: {len(schema)} mutants, each the same switched on as built "
          f"on its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
