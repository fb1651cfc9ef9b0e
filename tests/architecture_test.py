#!/usr/bin/python3
"""The include rules of docs/architecture.md, checked against the code.

Every quoted include of every C/C++ file in a module is read, and each rule is checked:
  1. a module includes public headers (cxlkv/<module>/...) only of the modules it may depend
     on (ALLOWED: dependencies point down; base/ is the bottom, every module may use it and
     it uses none);
  2. no module includes another module's private headers (a header under <module>/src/);
     tests and benchmarks may (white-box: a private step's behaviour or cost);
  3. nvme/ never includes tier/; tier/ and nvme/ never include the lease protocol's headers
     (coherence/prefix.h, domain_layout.h, mem.h, sim.h): the tiers name blocks by key.h alone;
  4. bench/replay/ includes no allocator/ header (it drives the tiers, not the allocator);
  5. orchestrator/daemon/ includes none of the client's headers (orchestrator/client/include):
     the daemon links the token target (orchestrator/token/), never the client library;
  6. outside tier/ (and tests), no code reaches a store's parts through `.allocator()`,
     `.manager()` or `.nvme()`: tier::TieredStore is the only door to its allocator, manager
     and NVMe store, and what a driver needs of them is the store's own operation;
  7. capi/ includes of the orchestrator only the client's headers (orchestrator/client/,
     orchestrator/token/) and the LMCache key (cxlkv/orchestrator/lmcache/index_key.h, the
     cxlkv::lmcache_key target): libcxlkv.so never links the daemon or the coordinator.
PENDING lists the known violations a later step of issue #31 removes; each must still occur
(a stale entry fails too), so the list only shrinks. Prints file:line for every violation.
Usage: architecture_test.py [SOURCE_DIR]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))

# Module -> the modules whose public headers it may include (besides its own).
ALLOWED = {
    "base": set(),
    "coherence": {"base"},
    "pool": {"base", "coherence"},
    "allocator": {"base", "pool", "coherence"},
    "nvme": {"base", "pool", "coherence"},
    "tier": {"base", "nvme", "allocator", "pool", "coherence"},
    "gpu": {"base", "pool", "coherence"},
    "preload": {"base", "gpu", "pool", "coherence"},
    "orchestrator": {"base", "tier", "pool", "coherence"},
    "integrations": {"base", "lmcache", "coherence", "pool", "orchestrator"},
    "capi": {"base", "allocator", "coherence", "gpu", "nvme", "orchestrator", "pool", "tier"},
    "tools": {"base", "allocator", "coherence", "orchestrator", "pool", "tier", "nvme", "lmcache"},
    "bench": {"base", "allocator", "coherence", "gpu", "nvme", "orchestrator", "pool", "tier",
              "replay", "lmcache"},
}
# The public header namespace of a module when it differs from its directory.
PROVIDES = {"integrations": {"lmcache"}, "bench": {"replay"}}
PROTOCOL = {"cxlkv/coherence/prefix.h", "cxlkv/coherence/domain_layout.h",
            "cxlkv/coherence/mem.h", "cxlkv/coherence/sim.h"}
# (file, included header): violations still to be removed, and by what.
PENDING = {}

# Rule 5: the client library's public headers, which the daemon never includes.
CLIENT_INCLUDE = os.path.join("orchestrator", "client", "include")
# Rule 7: besides the client's and the token's headers, the one orchestrator header capi/ uses.
TOKEN_INCLUDE = os.path.join("orchestrator", "token", "include")
CAPI_ORCHESTRATOR = {"cxlkv/orchestrator/lmcache/index_key.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# Rule 6: a store's parts reached from outside tier/.
PARTS = re.compile(r"(?:\.|->)(allocator|manager|nvme)\(\)")
EXTS = (".cc", ".h", ".cu", ".c")


def files_of(module):
    for d, _, names in os.walk(os.path.join(ROOT, module)):
        for n in names:
            if n.endswith(EXTS):
                yield os.path.join(d, n)


def main():
    private = {}  # basename of a src/ header -> modules holding one
    for m in ALLOWED:
        for f in files_of(m):
            if "/src/" in f and f.endswith(".h"):
                private.setdefault(os.path.basename(f), set()).add(m)
    client_headers, token_headers = set(), set()
    for include, headers in ((CLIENT_INCLUDE, client_headers), (TOKEN_INCLUDE, token_headers)):
        for d, _, names in os.walk(os.path.join(ROOT, include)):
            for n in names:
                headers.add(os.path.relpath(os.path.join(d, n), os.path.join(ROOT, include)))
    bad, seen_pending = [], set()
    for m, allowed in ALLOWED.items():
        own = {m} | PROVIDES.get(m, set())
        for f in files_of(m):
            rel = os.path.relpath(f, ROOT)
            with open(f, encoding="utf-8", errors="replace") as fh:
                for no, line in enumerate(fh, 1):
                    if m != "tier" and not line.lstrip().startswith("//"):
                        for part in PARTS.findall(line):
                            bad.append(f"{rel}:{no}: .{part}() outside tier/: a store's parts "
                                       "are reached through tier::TieredStore's operations "
                                       "(rule 6)")
                    g = INCLUDE.match(line)
                    if not g:
                        continue
                    inc = g.group(1)
                    where = f"{rel}:{no}: {inc}"
                    if (rel, inc) in PENDING:
                        seen_pending.add((rel, inc))
                        continue
                    parts = inc.split("/")
                    if parts[0] == "cxlkv" and len(parts) > 2:
                        dep = parts[1]
                        if dep not in own and dep not in allowed:
                            bad.append(f"{where}: {m}/ may not depend on {dep}/ (rule 1)")
                        if m in ("nvme",) and dep == "tier":
                            bad.append(f"{where}: nvme/ never includes tier/ (rule 3)")
                        if m in ("tier", "nvme") and inc in PROTOCOL:
                            bad.append(f"{where}: the tiers never include the lease protocol "
                                       "(rule 3)")
                        if rel.startswith("bench/replay/") and dep == "allocator":
                            bad.append(f"{where}: the replay never includes allocator/ (rule 4)")
                        if rel.startswith("orchestrator/daemon/") and inc in client_headers:
                            bad.append(f"{where}: the daemon never includes the client's "
                                       "headers; what both ends share goes into a target of "
                                       "its own, as token.h did (rule 5)")
                        if (m == "capi" and dep == "orchestrator" and inc not in client_headers
                                and inc not in token_headers and inc not in CAPI_ORCHESTRATOR):
                            bad.append(f"{where}: capi/ uses of the orchestrator only the "
                                       "client, the token and the LMCache key (index_key.h); "
                                       "what it needs of the daemon's side goes into a target "
                                       "of its own, as cxlkv::lmcache_key did (rule 7)")
                    elif "/" not in inc or inc.startswith(".."):
                        base = os.path.basename(inc)
                        holders = private.get(base, set())
                        local = os.path.exists(os.path.join(os.path.dirname(f), inc))
                        # Benchmarks, like tests, may be white-box (a private step's cost).
                        if holders and m not in holders and not local and m != "bench":
                            bad.append(f"{where}: a private header of {sorted(holders)} (rule 2)")
    for key, why in PENDING.items():
        if key not in seen_pending:
            bad.append(f"{key[0]}: no longer includes {key[1]}: remove it from PENDING ({why})")
    for b in bad:
        print(b)
    print(f"architecture_test: {len(ALLOWED)} modules checked, {len(bad)} violation(s), "
          f"{len(PENDING)} pending (docs/architecture.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
