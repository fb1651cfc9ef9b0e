/* The C API's tier (cxlkv_tier_*) through libcxlkv.so alone: a memfd arena as the CXL tier and
 * a real NVMe store (O_DIRECT files on io_uring) in a fresh temporary directory. Covers the
 * rule's placements, lookup, read, prefetch (poll and wait), demote, drop, acquire, explain
 * and stats; byte-exact round trips through demote -> read -> promote and across a reopen;
 * watermarks and the cool-down; threads; and bad input. Exits 0 when every check passes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"

static int failures = 0;
#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              cxlkv_last_error());                                                            \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

enum { kBlock0 = 16384, kBlock1 = 32768, kMaxChain = 64 };

static char dir[256];

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void Path(char* out, size_t n, const char* name) { snprintf(out, n, "%s/%s", dir, name); }

static void WriteFile(const char* name, const char* text) {
  char p[512];
  Path(p, sizeof(p), name);
  FILE* f = fopen(p, "w");
  if (f == NULL) {
    perror(p);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

/* Block contents derived from the key alone, so any copy can be checked against it. */
static void Fill(void* dst, size_t n, cxlkv_prefix_key k) {
  uint64_t x = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) | 1;
  unsigned char* p = (unsigned char*)dst;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + i, &x, n - i < 8 ? n - i : 8);
  }
}

static int Intact(const void* src, size_t n, cxlkv_prefix_key k) {
  void* want = malloc(n);
  Fill(want, n, k);
  const int same = memcmp(want, src, n) == 0;
  free(want);
  return same;
}

/* A request's chain from 32-byte digests (what an engine's own chained page hash gives). */
static void Chain(uint64_t ns, uint64_t salt, size_t n, cxlkv_prefix_key* keys) {
  for (size_t b = 0; b < n; ++b) {
    unsigned char digest[32];
    for (int i = 0; i < 32; ++i) digest[i] = (unsigned char)(salt * 31 + b * 7 + (uint64_t)i);
    CHECK(cxlkv_prefix_key_from_digest(ns, b ? &keys[b - 1] : NULL, digest, 32, &keys[b]) ==
          CXLKV_OK);
  }
}

static cxlkv_tier_request Request(uint64_t ns, const cxlkv_prefix_key* chain, size_t n,
                                  size_t first) {
  cxlkv_tier_request r;
  memset(&r, 0, sizeof(r));
  r.ns = ns;
  r.chain = chain;
  r.n = n;
  r.first = first;
  return r;
}

/* Places chain[first..n) with contents from Fill; results into res. */
static int PlaceFilled(cxlkv_tier* t, const cxlkv_tier_request* r, size_t len, int* res) {
  const size_t count = r->n - r->first;
  void* bufs[kMaxChain];
  for (size_t i = 0; i < count; ++i) {
    bufs[i] = malloc(len);
    Fill(bufs[i], len, r->chain[r->first + i]);
  }
  const int rc = cxlkv_tier_place(t, r, (const void* const*)bufs, len, res);
  for (size_t i = 0; i < count; ++i) free(bufs[i]);
  return rc;
}

/* Reads n keys and checks every byte; returns how many were intact. res may be NULL. */
static size_t ReadCheck(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, size_t len,
                        int* res) {
  void* bufs[kMaxChain];
  int local[kMaxChain];
  int* r = res ? res : local;
  for (size_t i = 0; i < n; ++i) {
    if (posix_memalign(&bufs[i], 4096, len) != 0) exit(1);
    memset(bufs[i], 0xEE, len);
  }
  (void)cxlkv_tier_read(t, keys, n, bufs, len, r);
  size_t ok = 0;
  for (size_t i = 0; i < n; ++i) {
    if (r[i] >= 0 && Intact(bufs[i], len, keys[i])) ++ok;
    free(bufs[i]);
  }
  return ok;
}

static int Residence(cxlkv_tier* t, cxlkv_prefix_key k) {
  cxlkv_tier_location loc;
  CHECK(cxlkv_tier_lookup(t, &k, 1, &loc) == CXLKV_OK);
  return loc.residence;
}

static char explain_buf[65536];
static const char* Explain(cxlkv_tier* t, cxlkv_prefix_key k, uint32_t flags) {
  explain_buf[0] = '\0';
  CHECK(cxlkv_tier_explain(t, &k, flags, explain_buf, sizeof(explain_buf), NULL) == CXLKV_OK);
  return explain_buf;
}

static void OpenOptions(cxlkv_tier_options* o, uint32_t cls, const char* nvme, const char* cfg) {
  static char nvme_path[512], cfg_path[512];
  memset(o, 0, sizeof(*o));
  o->size_class = cls;
  Path(nvme_path, sizeof(nvme_path), nvme);
  o->nvme_dir = nvme_path;
  if (cfg != NULL) {
    Path(cfg_path, sizeof(cfg_path), cfg);
    o->config_path = cfg_path;
  }
}

/* ---- keys from an engine's digest ---------------------------------------------------------- */

static void TestDigestKeys(void) {
  unsigned char d[32];
  for (int i = 0; i < 32; ++i) d[i] = (unsigned char)(i * 7 + 1);
  const cxlkv_prefix_key parent = {0x1111222233334444ull, 0x5555666677778888ull};
  cxlkv_prefix_key k;
  /* The frozen format (cxlkv.h): these values were computed from the documented input layout
   * with libxxhash directly; a change here changes every engine's keys. */
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 16, &k) == CXLKV_OK);
  CHECK(k.lo == 0xfa0bf79f338db8e0ull && k.hi == 0x78d27ecb1c93bebaull);
  CHECK(cxlkv_prefix_key_from_digest(42, &parent, d, 16, &k) == CXLKV_OK);
  CHECK(k.lo == 0x5aa18338691c3f46ull && k.hi == 0xe5c560d7897e925dull);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 32, &k) == CXLKV_OK);
  CHECK(k.lo == 0x1a5458cd078495d9ull && k.hi == 0x5cb8d4e3c2a17851ull);
  CHECK(cxlkv_prefix_key_from_digest(42, &parent, d, 32, &k) == CXLKV_OK);
  CHECK(k.lo == 0xf4b3e504f02c8f83ull && k.hi == 0x870e3e60d66c466aull);
  /* Every input counts: namespace, parent, each digest byte. */
  cxlkv_prefix_key a, b;
  CHECK(cxlkv_prefix_key_from_digest(43, &parent, d, 32, &a) == CXLKV_OK);
  CHECK(a.lo != k.lo || a.hi != k.hi);
  d[31] ^= 1;
  CHECK(cxlkv_prefix_key_from_digest(42, &parent, d, 32, &b) == CXLKV_OK);
  CHECK(b.lo != k.lo || b.hi != k.hi);
  /* A digest key is not the token chain's key of the same bytes. */
  const cxlkv_prefix_key tok = cxlkv_prefix_key_chain(42, NULL, (const uint32_t*)d, 4);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 16, &a) == CXLKV_OK);
  CHECK(a.lo != tok.lo || a.hi != tok.hi);
  /* Bad input: wrong lengths, NULLs; *out untouched. */
  cxlkv_prefix_key untouched = {7, 7};
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 20, &untouched) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "20 bytes") != NULL);
  CHECK(strstr(cxlkv_last_error(), "32-byte") != NULL);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 0, &untouched) == CXLKV_E_INVALID);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 64, &untouched) == CXLKV_E_INVALID);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, NULL, 32, &untouched) == CXLKV_E_INVALID);
  CHECK(cxlkv_prefix_key_from_digest(42, NULL, d, 32, NULL) == CXLKV_E_INVALID);
  CHECK(untouched.lo == 7 && untouched.hi == 7);
}

/* ---- bad options ---------------------------------------------------------------------------- */

static void TestBadOpen(cxlkv_arena* arena) {
  cxlkv_tier_options o;
  cxlkv_tier* t = NULL;
  OpenOptions(&o, 0, "nvme-bad", NULL);
  CHECK(cxlkv_tier_open(NULL, &o, &t) == CXLKV_E_INVALID);
  o.cxl_kind = 7; /* an unknown tier */
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "cxl_kind 7") != NULL);
  CHECK(strstr(cxlkv_last_error(), "CXLKV_TIER_CXL_POOLED") != NULL);
  o.cxl_kind = 0;
  o.size_class = 9;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "size_class 9") != NULL);
  o.size_class = 0;
  o.cxl_blocks = 1u << 30;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "cxl_blocks") != NULL);
  o.cxl_blocks = 0;
  o.nvme_dir = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "nvme_dir") != NULL);
  OpenOptions(&o, 0, "nvme-bad", NULL);
  o.flags = 0x40;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "unknown flags 0x40") != NULL);
  o.flags = CXLKV_TIER_NVME_STAGE_READS | CXLKV_TIER_NVME_DIRECT_READS;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "contradict") != NULL);

  WriteFile("bad-value.toml", "[placement]\nttft_budget_ms = 300\nnvme_read_gbps = -3\n");
  OpenOptions(&o, 0, "nvme-bad", "bad-value.toml");
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "bad-value.toml:3") != NULL);
  CHECK(strstr(cxlkv_last_error(), "placement.nvme_read_gbps") != NULL);
  CHECK(strstr(cxlkv_last_error(), "out of range") != NULL);
  CHECK(strstr(cxlkv_last_error(), "domain.example.toml") != NULL); /* the fix */
  WriteFile("bad-key.toml", "[placement]\nbogus = 1\n");
  OpenOptions(&o, 0, "nvme-bad", "bad-key.toml");
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "placement.bogus") != NULL);
  CHECK(strstr(cxlkv_last_error(), "unknown key") != NULL);
  WriteFile("bad-rule.toml", "[placement]\nlow_watermark = 0.9\nhigh_watermark = 0.5\n");
  OpenOptions(&o, 0, "nvme-bad", "bad-rule.toml");
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "watermark") != NULL);
  WriteFile("no-pooled.toml", "[placement]\ncxl_tiers = [\"expanded\"]\n");
  OpenOptions(&o, 0, "nvme-bad", "no-pooled.toml");
  o.cxl_kind = CXLKV_TIER_CXL_POOLED;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "placement.cxl_tiers") != NULL);
  OpenOptions(&o, 0, "nvme-bad", "missing.toml");
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_E_NOT_FOUND);
  CHECK(strstr(cxlkv_last_error(), "missing.toml") != NULL);
  CHECK(t == NULL);
}

/* ---- placement by the rule, lookup, read, explain ------------------------------------------- */

static void TestRule(cxlkv_tier* t, cxlkv_arena* arena) {
  const uint64_t ns = cxlkv_namespace("tenant", "model", "layout");
  const uint64_t ns2 = cxlkv_namespace("tenant", "other-model", "layout");
  int res[kMaxChain];

  /* Hot: its first four blocks used twice within microseconds (far below the break-even
   * interval of a few seconds): CXL. Blocks 4..7 have no history of their own and take their
   * nearest ancestor's interval: CXL too. */
  cxlkv_prefix_key hot[8];
  Chain(ns, 1, 8, hot);
  cxlkv_tier_request r = Request(ns, hot, 4, 0);
  CHECK(cxlkv_tier_use(t, &r) == CXLKV_OK);
  CHECK(cxlkv_tier_use(t, &r) == CXLKV_OK);
  r = Request(ns, hot, 8, 0);
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  for (int i = 0; i < 8; ++i) CHECK(res[i] == CXLKV_TIER_IN_CXL);
  CHECK(strstr(Explain(t, hot[1], 0), "below-break-even") != NULL);
  CHECK(strstr(Explain(t, hot[6], CXLKV_TIER_EXPLAIN_JSON), "\"reuse_source\": \"ancestor\"") !=
        NULL);

  /* Cold: never used, nothing to inherit: NVMe, above the break-even interval. */
  cxlkv_prefix_key cold[4];
  Chain(ns2, 2, 4, cold);
  r = Request(ns2, cold, 4, 0);
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  for (int i = 0; i < 4; ++i) CHECK(res[i] == CXLKV_TIER_ON_NVME);
  const char* js = Explain(t, cold[2], CXLKV_TIER_EXPLAIN_JSON);
  CHECK(strstr(js, "\"residence\": \"nvme\"") != NULL);
  CHECK(strstr(js, "\"clause\": \"above-break-even\"") != NULL);
  CHECK(strstr(js, "\"file\"") != NULL);

  /* One token: recomputing it (10 us at this config's 100k tokens/s) beats the NVMe fetch
   * (81 us) of a block not worth CXL: dropped. */
  cxlkv_prefix_key cheap[2];
  Chain(ns2, 3, 2, cheap);
  r = Request(ns2, cheap, 2, 0);
  r.tokens = 1;
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  CHECK(res[0] == CXLKV_TIER_DROPPED && res[1] == CXLKV_TIER_DROPPED);
  CHECK(Residence(t, cheap[0]) == CXLKV_TIER_MISSING);
  CHECK(strstr(Explain(t, cheap[0], 0), "recompute-cheaper") != NULL);

  /* Pinned namespace: CXL whatever its reuse. */
  cxlkv_prefix_key pinned[3];
  Chain(ns2, 4, 3, pinned);
  r = Request(ns2, pinned, 3, 0);
  r.pin = 2;
  r.flags = CXLKV_TIER_RECORD_USE;
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  for (int i = 0; i < 3; ++i) CHECK(res[i] == CXLKV_TIER_IN_CXL);
  CHECK(strstr(Explain(t, pinned[0], 0), "pinned") != NULL);

  /* Placing a held key again copies nothing and says where it is. */
  r = Request(ns2, cold, 4, 3);
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  CHECK(res[0] == CXLKV_TIER_ON_NVME);

  /* lookup: residence, and the block's address and ref when in CXL. */
  cxlkv_tier_location loc[3];
  const cxlkv_prefix_key probe[3] = {hot[0], cold[0], cheap[0]};
  CHECK(cxlkv_tier_lookup(t, probe, 3, loc) == CXLKV_OK);
  CHECK(loc[0].residence == CXLKV_TIER_IN_CXL && loc[0].addr != NULL);
  CHECK(Intact(loc[0].addr, kBlock0, hot[0]));
  void* addr = NULL;
  CHECK(cxlkv_ref_to_addr(arena, &loc[0].ref, &addr) == CXLKV_OK && addr == loc[0].addr);
  CHECK(loc[1].residence == CXLKV_TIER_ON_NVME && loc[1].addr == NULL);
  CHECK(loc[2].residence == CXLKV_TIER_MISSING);

  /* read: from CXL and from NVMe alike; a missing key fails on its own. */
  CHECK(ReadCheck(t, hot, 8, kBlock0, res) == 8);
  CHECK(res[0] == CXLKV_TIER_IN_CXL);
  CHECK(ReadCheck(t, cold, 4, kBlock0, res) == 4);
  CHECK(res[0] == CXLKV_TIER_ON_NVME);
  const cxlkv_prefix_key mixed[3] = {hot[2], cheap[1], cold[1]};
  CHECK(ReadCheck(t, mixed, 3, kBlock0, res) == 2);
  CHECK(res[0] == CXLKV_TIER_IN_CXL && res[1] == CXLKV_E_NOT_FOUND && res[2] == CXLKV_TIER_ON_NVME);
  /* An unaligned destination goes through a bounce buffer, same bytes. */
  unsigned char* raw = malloc(kBlock0 + 1);
  void* dst = raw + 1;
  CHECK(cxlkv_tier_read(t, &cold[3], 1, &dst, kBlock0, res) == CXLKV_OK);
  CHECK(Intact(dst, kBlock0, cold[3]));
  free(raw);

  /* Bad input on a live tier. */
  r = Request(ns, hot, 8, 0);
  CHECK(PlaceFilled(t, &r, kBlock0 - 1, res) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "16384") != NULL);
  r = Request(ns, hot, 8, 8);
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_E_INVALID);
  r = Request(ns, hot, 8, 0);
  r.pin = 9;
  CHECK(cxlkv_tier_use(t, &r) == CXLKV_E_INVALID);
  CHECK(cxlkv_tier_place(NULL, &r, NULL, kBlock0, NULL) == CXLKV_E_INVALID);
  CHECK(cxlkv_tier_read(t, hot, 1, &dst, kBlock0 * 2, NULL) == CXLKV_E_INVALID);
  CHECK(cxlkv_tier_lookup(NULL, hot, 1, loc) == CXLKV_E_INVALID);
  size_t need = 0;
  CHECK(cxlkv_tier_explain(t, &hot[0], 0, NULL, 0, &need) == CXLKV_OK && need > 100);
  char small[16];
  CHECK(cxlkv_tier_explain(t, &hot[0], 0, small, sizeof(small), &need) == CXLKV_E_INVALID);
  CHECK(strlen(small) == sizeof(small) - 1);
  CHECK(cxlkv_tier_explain(t, &hot[0], 0x80, explain_buf, sizeof(explain_buf), NULL) ==
        CXLKV_E_INVALID);

  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_OK);
  CHECK(s.block_bytes == kBlock0);
  CHECK(s.placed_cxl == 11 && s.placed_nvme == 4 && s.placed_dropped == 2);
  CHECK(s.already_held == 1);
  CHECK(s.cxl_blocks == 11 && s.nvme_blocks == 4);
  CHECK(s.uses == 11); /* 2 x 4 hot, 3 pinned */
  uint64_t by_clause = 0;
  for (int c = 0; c < 6; ++c) by_clause += s.clauses[c];
  CHECK(by_clause == s.decisions && s.decisions == 17);
  CHECK(s.clauses[0] == 3 && s.clauses[1] == 2 && s.clauses[2] == 8 && s.clauses[5] == 4);
  CHECK(s.from_ancestor == 4);
  CHECK(s.cxl_reads == 9 && s.nvme_reads == 6);
  CHECK(s.break_even_s > 1 && s.break_even_s < 100);
}

/* ---- demote -> read -> promote, byte for byte ----------------------------------------------- */

static void TestRoundTrip(cxlkv_tier* t) {
  const uint64_t ns = cxlkv_namespace("tenant", "model", "layout");
  int res[kMaxChain];
  cxlkv_prefix_key hot[8];
  Chain(ns, 1, 8, hot); /* TestRule's hot chain, in CXL */
  CHECK(cxlkv_tier_demote(t, hot, 8, res) == CXLKV_OK);
  for (int i = 0; i < 8; ++i) CHECK(res[i] == CXLKV_TIER_ON_NVME);
  CHECK(Residence(t, hot[5]) == CXLKV_TIER_ON_NVME);
  CHECK(strstr(Explain(t, hot[5], 0), "demoted-by-caller") != NULL);
  CHECK(cxlkv_tier_demote(t, hot, 1, res) == CXLKV_OK && res[0] == CXLKV_TIER_ON_NVME);
  CHECK(ReadCheck(t, hot, 8, kBlock0, res) == 8);
  for (int i = 0; i < 8; ++i) CHECK(res[i] == CXLKV_TIER_ON_NVME); /* read, not promoted */

  /* The rule wants them back in CXL (hot, cool-down 0): promoted. Polled to completion. */
  cxlkv_tier_request r = Request(ns, hot, 8, 0);
  uint64_t ticket = 0;
  CHECK(cxlkv_tier_prefetch(t, &r, &ticket) == CXLKV_OK);
  int rc = CXLKV_E_PENDING;
  for (const double until = Now() + 30; rc == CXLKV_E_PENDING && Now() < until;) {
    rc = cxlkv_tier_prefetch_poll(t, ticket, res);
  }
  CHECK(rc == CXLKV_OK);
  for (int i = 0; i < 8; ++i) CHECK(res[i] == CXLKV_TIER_IN_CXL);
  CHECK(cxlkv_tier_prefetch_poll(t, ticket, res) == CXLKV_E_NOT_FOUND); /* collected */
  CHECK(cxlkv_tier_prefetch_wait(t, 987654, res) == CXLKV_E_NOT_FOUND);
  cxlkv_tier_location loc[8];
  CHECK(cxlkv_tier_lookup(t, hot, 8, loc) == CXLKV_OK);
  for (int i = 0; i < 8; ++i) {
    CHECK(loc[i].residence == CXLKV_TIER_IN_CXL);
    CHECK(loc[i].addr != NULL && Intact(loc[i].addr, kBlock0, hot[i]));
  }
  CHECK(ReadCheck(t, hot, 8, kBlock0, res) == 8);
  CHECK(strstr(Explain(t, hot[3], CXLKV_TIER_EXPLAIN_JSON), "\"event\": \"promoted\"") != NULL);

  /* Cold blocks: the rule keeps them on NVMe; forced, they come up. */
  cxlkv_prefix_key cold[4];
  Chain(cxlkv_namespace("tenant", "other-model", "layout"), 2, 4, cold);
  r = Request(cxlkv_namespace("tenant", "other-model", "layout"), cold, 4, 0);
  CHECK(cxlkv_tier_prefetch(t, &r, &ticket) == CXLKV_OK);
  CHECK(cxlkv_tier_prefetch_wait(t, ticket, res) == CXLKV_OK);
  for (int i = 0; i < 4; ++i) CHECK(res[i] == CXLKV_TIER_ON_NVME);
  CHECK(strstr(Explain(t, cold[0], 0), "prefetch-kept-on-nvme") != NULL);
  r.flags = CXLKV_TIER_PREFETCH_FORCE;
  CHECK(cxlkv_tier_prefetch(t, &r, &ticket) == CXLKV_OK);
  CHECK(cxlkv_tier_prefetch_wait(t, ticket, res) == CXLKV_OK);
  for (int i = 0; i < 4; ++i) CHECK(res[i] == CXLKV_TIER_IN_CXL);
  CHECK(ReadCheck(t, cold, 4, kBlock0, res) == 4 && res[0] == CXLKV_TIER_IN_CXL);

  /* A pin keeps a block in CXL: demotion refused until released. */
  void* addr = NULL;
  cxlkv_block_ref ref;
  CHECK(cxlkv_tier_acquire(t, &cold[0], &addr, &ref) == CXLKV_OK);
  CHECK(addr != NULL && Intact(addr, kBlock0, cold[0]));
  CHECK(cxlkv_tier_demote(t, &cold[0], 1, res) == CXLKV_E_BUSY && res[0] == CXLKV_E_BUSY);
  CHECK(strstr(cxlkv_strerror(CXLKV_E_BUSY), "busy") != NULL);
  CHECK(cxlkv_tier_drop(t, &cold[0], 1, res) == CXLKV_E_BUSY);
  CHECK(cxlkv_tier_release(t, &cold[0]) == CXLKV_OK);
  CHECK(cxlkv_tier_demote(t, &cold[0], 1, res) == CXLKV_OK);
  CHECK(cxlkv_tier_acquire(t, &cold[0], &addr, NULL) == CXLKV_E_BUSY); /* on NVMe */
  cxlkv_prefix_key nobody = {1, 2};
  CHECK(cxlkv_tier_acquire(t, &nobody, &addr, NULL) == CXLKV_E_NOT_FOUND);
  CHECK(cxlkv_tier_release(t, &nobody) == CXLKV_E_NOT_FOUND);
  CHECK(cxlkv_tier_demote(t, &nobody, 1, res) == CXLKV_E_NOT_FOUND);

  /* Drop forgets a block wherever it is. */
  CHECK(cxlkv_tier_drop(t, cold, 2, res) == CXLKV_OK);
  CHECK(res[0] == CXLKV_TIER_MISSING && res[1] == CXLKV_TIER_MISSING);
  CHECK(Residence(t, cold[0]) == CXLKV_TIER_MISSING && Residence(t, cold[1]) == CXLKV_TIER_MISSING);
  CHECK(cxlkv_tier_drop(t, cold, 1, res) == CXLKV_E_NOT_FOUND);

  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_OK);
  CHECK(s.demotions == 9 && s.promotions == 12 && s.prefetch_kept == 4);
}

/* ---- blocks the caller filled in place ------------------------------------------------------ */

static void TestPlaceBlocks(cxlkv_tier* t, cxlkv_arena* arena) {
  const uint64_t ns = cxlkv_namespace("tenant", "blocks", "layout");
  cxlkv_prefix_key keys[2];
  Chain(ns, 9, 2, keys);
  cxlkv_block_ref refs[2];
  void* addrs[2];
  cxlkv_arena_stats before, after;
  CHECK(cxlkv_arena_stats_get(arena, &before) == CXLKV_OK);
  const uint64_t held_before = before.classes[0].allocs - before.classes[0].frees;
  for (int i = 0; i < 2; ++i) {
    CHECK(cxlkv_alloc(arena, 0, &refs[i], &addrs[i]) == CXLKV_OK);
    Fill(addrs[i], kBlock0, keys[i]);
  }
  /* A block of another class is refused, and nothing is taken. */
  cxlkv_block_ref other;
  CHECK(cxlkv_alloc(arena, 1, &other, NULL) == CXLKV_OK);
  cxlkv_block_ref with_other[2] = {refs[0], other};
  int res[2];
  cxlkv_tier_request r = Request(ns, keys, 2, 0);
  CHECK(cxlkv_tier_place_blocks(t, &r, with_other, res) == CXLKV_E_FOREIGN);
  CHECK(strstr(cxlkv_last_error(), "size class 0") != NULL);
  CHECK(cxlkv_free(arena, &other) == CXLKV_OK);
  cxlkv_block_ref twice[2] = {refs[0], refs[0]};
  CHECK(cxlkv_tier_place_blocks(t, &r, twice, res) == CXLKV_E_INVALID);
  /* Pinned: kept in place, at the caller's address. */
  r = Request(ns, keys, 1, 0);
  r.pin = 3;
  CHECK(cxlkv_tier_place_blocks(t, &r, refs, res) == CXLKV_OK && res[0] == CXLKV_TIER_IN_CXL);
  cxlkv_tier_location loc;
  CHECK(cxlkv_tier_lookup(t, &keys[0], 1, &loc) == CXLKV_OK);
  CHECK(loc.residence == CXLKV_TIER_IN_CXL && loc.addr == addrs[0]);
  /* Cold: written to NVMe from the caller's block, which goes back to the arena. */
  r = Request(ns, keys, 2, 1);
  CHECK(cxlkv_tier_place_blocks(t, &r, &refs[1], res) == CXLKV_OK && res[0] == CXLKV_TIER_ON_NVME);
  CHECK(ReadCheck(t, keys, 2, kBlock0, NULL) == 2);
  CHECK(cxlkv_arena_stats_get(arena, &after) == CXLKV_OK);
  CHECK(after.classes[0].allocs - after.classes[0].frees == held_before + 1); /* keys[0]'s */
  /* A stale ref (freed since) is refused. */
  cxlkv_block_ref stale;
  CHECK(cxlkv_alloc(arena, 0, &stale, NULL) == CXLKV_OK);
  CHECK(cxlkv_free(arena, &stale) == CXLKV_OK);
  cxlkv_prefix_key k3[3];
  Chain(ns, 10, 3, k3);
  r = Request(ns, k3, 1, 0);
  CHECK(cxlkv_tier_place_blocks(t, &r, &stale, res) == CXLKV_E_STALE);
}

/* ---- watermarks, and threads under them ----------------------------------------------------- */

static void TestWatermarks(cxlkv_tier* t) {
  const uint64_t ns = cxlkv_namespace("tenant", "wm", "layout");
  cxlkv_prefix_key keys[30];
  Chain(ns, 20, 30, keys);
  cxlkv_tier_request r = Request(ns, keys, 30, 0);
  r.pin = 2; /* every block wants CXL; 20 fit (high watermark 19) */
  int res[30];
  CHECK(PlaceFilled(t, &r, kBlock1, res) == CXLKV_OK);
  for (int i = 0; i < 30; ++i) CHECK(res[i] == CXLKV_TIER_IN_CXL);
  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_OK);
  CHECK(s.cxl_capacity_blocks == 20 && s.high_watermark_blocks == 19);
  CHECK(s.low_watermark_blocks == 16);
  CHECK(s.watermark_runs >= 1 && s.cxl_blocks <= 19);
  CHECK(s.cxl_blocks + s.nvme_blocks == 30 && s.demotions == s.nvme_blocks);
  /* While the chain was placed, its oldest blocks were the least recently used. */
  CHECK(Residence(t, keys[0]) == CXLKV_TIER_ON_NVME);
  CHECK(Residence(t, keys[29]) == CXLKV_TIER_IN_CXL);
  const char* why = Explain(t, keys[0], 0);
  CHECK(strstr(why, "watermark-victim") != NULL && strstr(why, "pinned") != NULL);
  /* After it, the chain is marked used root first: new blocks push its tail out, not its
   * head. */
  int first_cxl = -1;
  for (int i = 0; i < 30 && first_cxl < 0; ++i) {
    if (Residence(t, keys[i]) == CXLKV_TIER_IN_CXL) first_cxl = i;
  }
  cxlkv_prefix_key more[4];
  Chain(ns, 21, 4, more);
  r = Request(ns, more, 4, 0);
  r.pin = 2;
  CHECK(PlaceFilled(t, &r, kBlock1, res) == CXLKV_OK);
  CHECK(first_cxl > 0 && Residence(t, keys[first_cxl]) == CXLKV_TIER_IN_CXL);
  CHECK(Residence(t, keys[29]) == CXLKV_TIER_ON_NVME);
  CHECK(ReadCheck(t, keys, 30, kBlock1, NULL) == 30);
  CHECK(ReadCheck(t, more, 4, kBlock1, NULL) == 4);
}

typedef struct {
  cxlkv_tier* t;
  int id;
  int bad;
} Worker;

/* A failed step of a worker, with the worker's own last error (it is per thread). */
static void Bad(Worker* w, int round, const char* step) {
  fprintf(stderr, "thread %d round %d: %s failed: %s\n", w->id, round, step, cxlkv_last_error());
  ++w->bad;
}

static void* Work(void* arg) {
  Worker* w = (Worker*)arg;
  const uint64_t ns = cxlkv_namespace("threads", "model", "layout");
  cxlkv_prefix_key keys[16];
  int res[16];
  for (int round = 0; round < 8; ++round) {
    Chain(ns, 1000 + (uint64_t)w->id * 100 + (uint64_t)round, 16, keys);
    cxlkv_tier_request r = Request(ns, keys, 16, 0);
    r.pin = round % 2 ? 2 : 0;
    if (PlaceFilled(w->t, &r, kBlock1, res) != CXLKV_OK) Bad(w, round, "place");
    if (ReadCheck(w->t, keys, 16, kBlock1, NULL) != 16) Bad(w, round, "read after place");
    if (cxlkv_tier_demote(w->t, keys, 4, res) != CXLKV_OK) {
      for (int i = 0; i < 4; ++i) {
        if (res[i] != CXLKV_TIER_ON_NVME && res[i] != CXLKV_E_BUSY) Bad(w, round, "demote");
      }
    }
    r.flags = CXLKV_TIER_PREFETCH_FORCE;
    uint64_t ticket = 0;
    if (cxlkv_tier_prefetch(w->t, &r, &ticket) != CXLKV_OK ||
        cxlkv_tier_prefetch_wait(w->t, ticket, res) != CXLKV_OK) {
      Bad(w, round, "prefetch");
    }
    if (ReadCheck(w->t, keys, 16, kBlock1, NULL) != 16) Bad(w, round, "read after prefetch");
  }
  return NULL;
}

static void TestThreads(cxlkv_tier* t) {
  enum { kThreads = 4 };
  pthread_t th[kThreads];
  Worker w[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    w[i] = (Worker){t, i, 0};
    CHECK(pthread_create(&th[i], NULL, Work, &w[i]) == 0);
  }
  for (int i = 0; i < kThreads; ++i) {
    pthread_join(th[i], NULL);
    if (w[i].bad != 0) fprintf(stderr, "thread %d: %d failures\n", i, w[i].bad);
    CHECK(w[i].bad == 0);
  }
  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_OK);
  CHECK(s.cxl_blocks <= s.high_watermark_blocks + kThreads * 16);
}

/* ---- reopen: NVMe blocks survive; the cool-down -------------------------------------------- */

static void TestReopenAndCooldown(cxlkv_arena* arena, const cxlkv_prefix_key* on_nvme, size_t n) {
  cxlkv_tier_options o;
  OpenOptions(&o, 1, "nvme1", NULL); /* the defaults: 5 s cool-down */
  /* Promotions staged through the store's 2 MiB-page buffers (the first open let the store
   * choose): the blocks read back right either way. */
  o.flags = CXLKV_TIER_NVME_STAGE_READS;
  cxlkv_tier* t = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_OK);
  if (t == NULL) return;
  int res[30];
  CHECK(ReadCheck(t, on_nvme, n, kBlock1, res) == n);
  for (size_t i = 0; i < n; ++i) CHECK(res[i] == CXLKV_TIER_ON_NVME);
  CHECK(strstr(Explain(t, on_nvme[0], 0), "found on NVMe when it opened") != NULL);

  const uint64_t ns = cxlkv_namespace("tenant", "cool", "layout");
  cxlkv_prefix_key k[1];
  Chain(ns, 77, 1, k);
  cxlkv_tier_request r = Request(ns, k, 1, 0);
  r.pin = 2;
  CHECK(PlaceFilled(t, &r, kBlock1, res) == CXLKV_OK && res[0] == CXLKV_TIER_IN_CXL);
  CHECK(cxlkv_tier_demote(t, k, 1, res) == CXLKV_OK);
  uint64_t ticket = 0;
  r.flags = CXLKV_TIER_PREFETCH_FORCE;
  CHECK(cxlkv_tier_prefetch(t, &r, &ticket) == CXLKV_OK);
  CHECK(cxlkv_tier_prefetch_wait(t, ticket, res) == CXLKV_OK);
  CHECK(res[0] == CXLKV_E_BUSY);
  CHECK(strstr(cxlkv_last_error(), "cool-down") != NULL);
  r.flags = 0;
  CHECK(cxlkv_tier_prefetch(t, &r, &ticket) == CXLKV_OK);
  CHECK(cxlkv_tier_prefetch_wait(t, ticket, res) == CXLKV_OK && res[0] == CXLKV_TIER_ON_NVME);
  CHECK(strstr(Explain(t, k[0], 0), "cooling down") != NULL);
  CHECK(ReadCheck(t, k, 1, kBlock1, res) == 1 && res[0] == CXLKV_TIER_ON_NVME);
  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_OK);
  CHECK(s.promotions_refused == 1 && s.promotions == 0);
  cxlkv_tier_close(t);
}

/* ---- a tier whose arena closed -------------------------------------------------------------- */

static void TestClosedTier(void) {
  cxlkv_pool* pool = NULL;
  CHECK(cxlkv_pool_open("memfd:tier-closed?size=8M", &pool) == CXLKV_OK);
  cxlkv_arena_options ao;
  memset(&ao, 0, sizeof(ao));
  ao.layout = (cxlkv_kv_layout){2, 2, 64, 2, 16, 0};
  cxlkv_arena* arena = NULL;
  CHECK(cxlkv_arena_create(pool, &ao, &arena) == CXLKV_OK);
  cxlkv_tier_options o;
  OpenOptions(&o, 0, "nvme-closed", NULL);
  cxlkv_tier* t = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_OK);
  cxlkv_tier* t2 = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t2) == CXLKV_E_EXISTS); /* one tier per class */
  const uint64_t ns = cxlkv_namespace("tenant", "closed", "layout");
  cxlkv_prefix_key k[2];
  Chain(ns, 5, 2, k);
  cxlkv_tier_request r = Request(ns, k, 2, 0);
  r.pin = 2;
  int res[2];
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_OK);
  cxlkv_arena_close(arena); /* the tier ends with it */
  CHECK(PlaceFilled(t, &r, kBlock0, res) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "closed") != NULL);
  CHECK(strstr(cxlkv_last_error(), "cxlkv_tier_close") != NULL);
  cxlkv_tier_location loc[2];
  CHECK(cxlkv_tier_lookup(t, k, 2, loc) == CXLKV_E_INVALID);
  CHECK(cxlkv_tier_block_size(t) == 0);
  cxlkv_tier_stats s;
  CHECK(cxlkv_tier_stats_get(t, &s) == CXLKV_E_INVALID);
  cxlkv_tier_close(t);
  /* The class is free again for a new arena. */
  CHECK(cxlkv_arena_open(pool, NULL, &arena) == CXLKV_OK);
  CHECK(cxlkv_tier_open(arena, &o, &t) == CXLKV_OK);
  CHECK(cxlkv_tier_block_size(t) == kBlock0);
  cxlkv_tier_close(t);
  cxlkv_tier_close(NULL);
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);
}

/* The scratch directory goes at every exit, exit(1) on a failed write included. */
static void RemoveDir(void) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(dir, sizeof(dir), "%s/cxlkv-capi-tier-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  atexit(RemoveDir);
  TestDigestKeys();

  cxlkv_pool* pool = NULL;
  CHECK(cxlkv_pool_open("memfd:tier?size=64M", &pool) == CXLKV_OK);
  cxlkv_arena_options ao;
  memset(&ao, 0, sizeof(ao));
  ao.layout = (cxlkv_kv_layout){2, 2, 64, 2, 16, 0}; /* 16 KiB per 16 tokens */
  ao.class_tokens[0] = 16;
  ao.class_tokens[1] = 32;
  cxlkv_arena* arena = NULL;
  CHECK(cxlkv_arena_create(pool, &ao, &arena) == CXLKV_OK);
  TestBadOpen(arena);

  /* No cool-down, and a recompute rate at which one token (10 us) beats an NVMe fetch of a
   * 16 KiB block (81 us) while a block's 16 tokens (160 us) do not. */
  WriteFile("fast.toml", "[placement]\ncooldown_ms = 0\nrecompute_tokens_per_s = 100000\n");
  cxlkv_tier_options o;
  OpenOptions(&o, 0, "nvme0", "fast.toml");
  o.nvme_blocks = 1000;
  cxlkv_tier* t0 = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t0) == CXLKV_OK);
  if (t0 != NULL) {
    CHECK(cxlkv_tier_block_size(t0) == kBlock0);
    TestRule(t0, arena);
    TestRoundTrip(t0);
    TestPlaceBlocks(t0, arena);
    cxlkv_tier_close(t0);
  }

  OpenOptions(&o, 1, "nvme1", "fast.toml");
  o.cxl_kind = CXLKV_TIER_CXL_POOLED;
  o.cxl_blocks = 20;
  cxlkv_tier* t1 = NULL;
  CHECK(cxlkv_tier_open(arena, &o, &t1) == CXLKV_OK);
  if (t1 != NULL) {
    TestWatermarks(t1);
    TestThreads(t1);
    /* What is on NVMe when the tier closes is there when it opens again. */
    const uint64_t ns = cxlkv_namespace("tenant", "wm", "layout");
    cxlkv_prefix_key keys[30], on_nvme[30];
    Chain(ns, 20, 30, keys);
    size_t n = 0;
    for (int i = 0; i < 30; ++i) {
      if (Residence(t1, keys[i]) == CXLKV_TIER_ON_NVME) on_nvme[n++] = keys[i];
    }
    CHECK(n > 0);
    cxlkv_tier_close(t1);
    TestReopenAndCooldown(arena, on_nvme, n);
  }
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);
  TestClosedTier();

  if (failures != 0) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("capi_tier_test: all checks passed\n");
  return 0;
}
