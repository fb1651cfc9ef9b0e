/*
 * prefix.pml -- Promela model of the shared-prefix protocol of docs/coherence.md, as
 * coherence/src/prefix_host.cc and prefix_owner.cc implement it, on memory that is NOT
 * coherent between hosts. docs/model.md maps every step to the code, states the assumptions
 * and lists what was checked; coherence/model/check.sh runs every check.
 *
 * Processes (3 hosts of one domain and its owner)
 *   Owner      PrefixOwner::Step: ApplyRequests, FenceExpiredHosts, Evict/Retire, Reclaim
 *   Publisher  host 0: writes blocks, posts PUBLISH requests, takes returned blocks back
 *   Reader(r)  hosts 1 and 2 (r = 0, 1): Lookup, Acquire, read + ValidateAfterCopy, Renew,
 *              Release, Heartbeat (+ Rejoin); faults: crash, restart, pause
 *   Evictor    the caches: a dirty line is written back, a clean copy dropped, at any time
 *   Monitor    index invariants: no block named by two entries, no named block handed back
 *
 * Non-coherent memory. Every shared line has one writer. The writer's cached copy (C_*, O_*,
 * with a dirty bit) and memory (M_*) are separate variables. A store changes the cache only;
 * Flush copies a dirty line to memory; the Evictor may also copy it at any time (a dirty line
 * evicted). A reader's Invalidate + load gets what memory holds at that step. A load with no
 * Invalidate goes through the reader's cached copy (HE_*, HB_*), which the Evictor may drop at
 * any time; those copies are kept only where some step reads without Invalidate (the bug
 * variants, and -DFULL_CACHES). Elsewhere every read refetches, so a reader's copy is dead
 * between reads and is dropped right after the read (which the Evictor may do anyway).
 *
 * Time. There are no clocks. What the owner may conclude from its own clock is bounded by
 * ghost state kept with each reader, that only time (not the reader's code) moves forward:
 *   LF[r]   lease row versions >= LF[r] are before their local deadline on host r's clock
 *           (version 0: the row in memory; version 1: the row a Renew is about to write)
 *   labels  every heartbeat is named 0 (past its deadline: send time + host_ttl - margin) or
 *           1, 2 (before it; 2 is younger); see hb_tick
 * The owner may judge lease version v expired only if v < LF[r], and may fence a host only if
 * the heartbeat it read is named 0: "the owner's TTL for a write fires only after the
 * writer's own deadline for it" (clock-rate drift bounded by the margin). docs/model.md,
 * "Assumptions".
 */

/* ---- sizes and bounds ---------------------------------------------------------------------- */
#define NR      2       /* reader hosts: hosts 1 and 2 of the domain (host 0 publishes)        */
#define NE      2       /* index entries; key k lives in entry k (probing abstracted)          */
#define NB      2       /* blocks                                                              */
#ifndef MAXPUB
#define MAXPUB  2       /* PUBLISH requests in all: bounds entry_gen and block reuse           */
#endif

/* entry_gen carries the state: 0 EMPTY, 3k+1 PUBLISHED, 3k+2 RETIRED, 3k+3 TOMBSTONE */
#define PUB(g)       ((g) % 3 == 1)
#define RET(g)       ((g) % 3 == 2)
#define LIVEG(g)     (PUB(g) || RET(g))

/* reader phases */
#define IDLE     0
#define LOOKED   1      /* Lookup returned (le, lg, lb)                                        */
#define ACQ      2      /* Acquire: lease row stored, flushed, full fence; not re-validated    */
#define HELD     3      /* Acquire re-validated the entry: the lease is held                   */
#define RENEW    4      /* Renew: clock sampled, the row not yet written again                 */
#define COPYING  5      /* a read started under a valid lease; the copy not yet validated      */
#define DOWN     6      /* crashed; will restart (Join again)                                  */
#define DEAD     7      /* crashed for good                                                    */

/* block life (ghost) */
#define B_OWN    0      /* with the publisher, not published since it was written             */
#define B_PUB    1      /* named by a PUBLISHED entry                                          */
#define B_RET    2      /* named by a RETIRED entry                                            */
#define B_FREED  3      /* reclaimed: handed back to the publisher; its data still intact      */
#define B_REUSED 4      /* the publisher wrote new data into it                                */

/* the owner's FenceExpiredHosts decision */
#define D_NONE   0
#define D_ACK    1
#define D_FENCE  2

#if defined(FULL_CACHES) || defined(BUG_STALE_REVALIDATE)
#define KEEP_ENTRY_CACHE 1
#endif
#if defined(FULL_CACHES) || defined(BUG_NO_INVALIDATE_BLOCK)
#define KEEP_BLOCK_CACHE 1
#endif
/* informational variants: ValidateAfterCopy without one of its two checks */
#ifndef NO_DEADLINE_CHECK
#define NO_DEADLINE_CHECK 0
#endif
#ifndef NO_GEN_CHECK
#define NO_GEN_CHECK 0
#endif

/* ---- index entries: written by the owner -------------------------------------------------- */
byte O_gen[NE]; bit O_blk[NE]; bit O_edirty[NE];      /* owner's cache (authoritative copy)   */
byte M_gen[NE]; bit M_blk[NE];                        /* memory                               */
bit  graced[NE];                                      /* retired at least one Step ago        */
bit  due[NE];                                         /* Reclaim: scanned, no lease: to free  */

/* ---- owner lines: written by the owner ---------------------------------------------------- */
byte O_fen[NR]; byte O_ai[NR]; byte O_ah[NR]; bit O_odirty[NR];   /* fenced_incarnation,      */
byte M_fen[NR]; byte M_ai[NR]; byte M_ah[NR];                     /* acked_incarnation, beat  */
bit  O_head; bit O_hdirty; bit M_head;                /* ring_head of host 0                  */
bit  O_ret[NB]; bit O_rdirty[NB]; bit M_ret[NB];      /* return ring: a toggle per block      */

/* ---- host rows and lease rows: written by reader r (one lease row each) ------------------- */
byte C_inc[NR]; byte C_hb[NR]; bit C_hdirty[NR];      /* incarnation, heartbeat (label)       */
byte M_inc[NR]; byte M_hb[NR];
bit  C_lh[NR]; bit C_le[NR]; byte C_lg[NR]; byte C_li[NR]; bit C_lv[NR]; bit C_ldirty[NR];
bit  M_lh[NR]; bit M_le[NR]; byte M_lg[NR]; byte M_li[NR]; bit M_lv[NR];
                                    /* held, entry, entry_gen, incarnation, lease_seq version */

/* ---- request slot: written by the publisher ----------------------------------------------- */
bit  C_rs; bit C_rk; bit C_rb; bit C_rdirty;          /* seq (a toggle), key, block           */
bit  M_rs; bit M_rk; bit M_rb;

/* ---- reader-local state ------------------------------------------------------------------- */
byte ph[NR];
bit  le[NR]; byte lg[NR]; bit lb[NR];                 /* the lease: entry, gen, block         */
byte HC[NR];                                          /* label of the newest credited beat    */
byte LF[NR];                                          /* ghost: lease versions >= LF fresh    */
#ifdef KEEP_ENTRY_CACHE
bit  HE_p[NR*NE]; byte HE_gen[NR*NE]; bit HE_blk[NR*NE];
#endif
#ifdef KEEP_BLOCK_CACHE
bit  HB_p[NR*NB]; byte HB_v[NR*NB];
#endif

/* ---- publisher-local state ---------------------------------------------------------------- */
bit  pown[NB];                                        /* blocks the publisher holds           */
bit  ptaken[NB];                                      /* return toggles consumed              */
byte npub;                                            /* PUBLISH requests posted              */
#ifdef DUP_REQUEST
bit  dupsent;
#endif

/* ---- the owner's FenceExpiredHosts read, pending until its write -------------------------- */
byte fh; byte ri; byte rb; byte dec;                  /* host, incarnation, beat, decision    */

/* ---- the blocks (ghost) ------------------------------------------------------------------- */
byte bwr[NB];                                         /* data version in memory (writes)      */
byte bst[NB];                                         /* B_*                                  */
bit  bent[NB]; byte bgen[NB]; byte bver[NB];          /* last publish: entry, gen, version    */

/* ---- predicates ---------------------------------------------------------------------------- */
#define ALIVE(r)    (HC[r] > 0)                       /* now <= alive_until_ms_               */
#define LEASE_OK(r) (LF[r] == 0 && ALIVE(r))          /* now <= lease.deadline_ms             */
#define RELIES(r)   (ph[r] >= HELD && ph[r] <= COPYING && LEASE_OK(r))
#define HOSTLIVE(h) (M_inc[h] > O_fen[h])             /* PrefixOwner::HostLive                */
/* data a reader of (e, g) on block b may use: published under (e, g), not rewritten since */
#define DATA_OK(b, e, g, v) (bent[b] == (e) && bgen[b] == (g) && (v) == bver[b])
#define NAMED(b)    ((LIVEG(O_gen[0]) && O_blk[0] == (b)) || (LIVEG(O_gen[1]) && O_blk[1] == (b)))

/* ---- cache primitives ---------------------------------------------------------------------- */
inline flush_entry(e) {
  if :: O_edirty[e] -> M_gen[e] = O_gen[e]; M_blk[e] = O_blk[e]; O_edirty[e] = 0
     :: else -> skip fi
}
inline flush_owner_line(h) {
  if :: O_odirty[h] -> M_fen[h] = O_fen[h]; M_ai[h] = O_ai[h]; M_ah[h] = O_ah[h]; O_odirty[h] = 0
     :: else -> skip fi
}
inline flush_head() { if :: O_hdirty -> M_head = O_head; O_hdirty = 0 :: else -> skip fi }
inline flush_ret(b) { if :: O_rdirty[b] -> M_ret[b] = O_ret[b]; O_rdirty[b] = 0 :: else -> skip fi }
inline flush_host_row(r) {
  if :: C_hdirty[r] -> M_inc[r] = C_inc[r]; M_hb[r] = C_hb[r]; C_hdirty[r] = 0
     :: else -> skip fi
}
inline flush_lease_row(r) {
  if :: C_ldirty[r] -> M_lh[r] = C_lh[r]; M_le[r] = C_le[r]; M_lg[r] = C_lg[r];
                       M_li[r] = C_li[r]; M_lv[r] = C_lv[r]; C_ldirty[r] = 0
     :: else -> skip fi
}
inline flush_request() {
  if :: C_rdirty -> M_rs = C_rs; M_rk = C_rk; M_rb = C_rb; C_rdirty = 0
     :: else -> skip fi
}
/* PrefixHost::WriteLeaseRow: store (into the cache), Flush, FullFence */
inline write_lease_row(r, held, e, g) {
  C_lh[r] = held; C_le[r] = e; C_lg[r] = g; C_li[r] = C_inc[r]; C_lv[r] = 0; C_ldirty[r] = 1;
  flush_lease_row(r)
}

/* reader r reads entry k into (g, b); read_entry_inv: Invalidate, then load */
#ifdef KEEP_ENTRY_CACHE
inline read_entry_inv(r, k, g, b) {
  HE_p[r*NE+k] = 1; HE_gen[r*NE+k] = M_gen[k]; HE_blk[r*NE+k] = M_blk[k];
  g = HE_gen[r*NE+k]; b = HE_blk[r*NE+k]
}
inline read_entry_cached(r, k, g, b) {     /* a load with no Invalidate: may hit a stale copy */
  if :: !HE_p[r*NE+k] -> HE_p[r*NE+k] = 1; HE_gen[r*NE+k] = M_gen[k]; HE_blk[r*NE+k] = M_blk[k]
     :: else -> skip fi;
  g = HE_gen[r*NE+k]; b = HE_blk[r*NE+k]
}
#else
inline read_entry_inv(r, k, g, b) { g = M_gen[k]; b = M_blk[k] }
#endif
#ifdef BUG_STALE_REVALIDATE
#define read_entry_reval(r, k, g, b) read_entry_cached(r, k, g, b)
#else
#define read_entry_reval(r, k, g, b) read_entry_inv(r, k, g, b)
#endif

/* reader r reads block b's data: the version it gets */
#ifdef KEEP_BLOCK_CACHE
inline read_block(r, b, v) {
#ifdef BUG_NO_INVALIDATE_BLOCK
  /* host 1 (r = 0) copies with no Invalidate of the block; host 2 does it right */
  if :: r == 0 && HB_p[r*NB+b] -> skip
     :: else -> HB_p[r*NB+b] = 1; HB_v[r*NB+b] = bwr[b] fi;
#else
  HB_p[r*NB+b] = 1; HB_v[r*NB+b] = bwr[b];            /* Invalidate the block's lines first */
#endif
  v = HB_v[r*NB+b]
}
#else
inline read_block(r, b, v) { v = bwr[b] }
#endif

/* ---- heartbeat labels -----------------------------------------------------------------------
 * A heartbeat is named by a label: 1 = before its deadline (send time + host_ttl - margin on
 * the host's clock), 0 = past it. Labels of reader r's current incarnation sit in its host
 * row (C_hb, M_hb), in HC (the newest acknowledged beat the host has credited: alive_until_ms_
 * is in the future iff HC = 1), in its owner line (O_ah, M_ah) and in the owner's pending read
 * (rb). Time passing turns every 1 into 0 at once (hb_tick). A beat sent while the previous
 * one is still fresh gets the same label (docs/model.md, "Abstractions"). */
inline hb_tick(r) {
  C_hb[r] = 0; HC[r] = 0;
  if :: M_inc[r] == C_inc[r] -> M_hb[r] = 0 :: else -> skip fi;
  if :: O_ai[r] == C_inc[r] -> O_ah[r] = 0 :: else -> skip fi;
  if :: M_ai[r] == C_inc[r] -> M_ah[r] = 0 :: else -> skip fi;
  if :: fh == r && dec != D_NONE && ri == C_inc[r] -> rb = 0 :: else -> skip fi
}

/* ---- incarnation labels ---------------------------------------------------------------------
 * Incarnations are compared only with each other (fenced_incarnation, acked_incarnation, the
 * lease rows' and the owner's pending read's), and a new one is above all earlier ones. So
 * they are named by labels too: 1 = reader r's current incarnation, 0 = any earlier one (or
 * none). A Rejoin renames every 1 of r into 0, then takes 1 itself; hosts may rejoin and
 * restart any number of times. */
inline inc_new(r) {
  O_fen[r] = 0; M_fen[r] = 0;                         /* fenced: an older incarnation      */
  O_ai[r] = 0; M_ai[r] = 0; O_ah[r] = 0; M_ah[r] = 0; /* acknowledged: an older one        */
  if :: fh == r && dec != D_NONE -> ri = 0; rb = 0 :: else -> skip fi;
  M_li[r] = 0; C_li[r] = 0;                           /* rows of an older incarnation       */
  C_inc[r] = 1; M_inc[r] = 0                          /* the new one (not in memory yet)    */
}

/* ---- reader helpers ------------------------------------------------------------------------ */
inline forget_lease(r) { ph[r] = IDLE; le[r] = 0; lg[r] = 0; lb[r] = 0; LF[r] = 0 }
inline release_row(r) {          /* PrefixHost::Release: held = 0, Flush, FullFence */
  write_lease_row(r, 0, 0, 0); forget_lease(r)
}
/* PrefixHost::Rejoin (and Join after a restart): an incarnation above the row's and the
 * fenced one (max + 1); lease rows cleared first, then the host row with a new heartbeat;
 * nothing is acknowledged for the new incarnation yet. */
inline rejoin(r) {
  inc_new(r);
  write_lease_row(r, 0, 0, 0);
  C_hb[r] = 1; C_hdirty[r] = 1; flush_host_row(r);
  forget_lease(r); HC[r] = 0
}

/* =============================================================================================
 * Reader hosts
 * ============================================================================================= */
proctype Reader(byte r) {
  byte g, tmp; bit b, k;
end_loop:
  do
  /* ---- Lookup(ns, key): Invalidate + read entry k; PUBLISHED is a hit. Takes no lease. */
  :: atomic { ph[r] == IDLE ->
       if :: k = 0 :: k = 1 fi;
       read_entry_inv(r, k, g, b);
       if :: PUB(g) -> le[r] = k; lg[r] = g; lb[r] = b; ph[r] = LOOKED
          :: else -> skip fi;
       g = 0; b = 0; k = 0 }

  /* ---- Acquire(hit), first half: alive (an acknowledged heartbeat), now sampled, then the
   *      lease row {held, entry, gen, incarnation, seq} stored, Flush, FullFence. */
  :: atomic { ph[r] == LOOKED && ALIVE(r) ->
       LF[r] = 0;
       C_lh[r] = 1; C_le[r] = le[r]; C_lg[r] = lg[r]; C_li[r] = C_inc[r]; C_lv[r] = 0;
       C_ldirty[r] = 1;
#ifndef BUG_NO_FLUSH_LEASE
       flush_lease_row(r);
#endif
       ph[r] = ACQ }
  /* ---- Acquire, second half: Invalidate + re-read the entry: still PUBLISHED(gen)? */
  :: atomic { ph[r] == ACQ ->
#ifdef BUG_NO_REVALIDATE
       g = lg[r];
#else
       read_entry_reval(r, le[r], g, b);
#endif
       if :: g == lg[r] -> ph[r] = HELD
          :: else -> release_row(r)                         /* kNotFound; the row cleared */
       fi;
       g = 0; b = 0 }

  /* ---- using the data under a valid lease (a zero-copy use, or the start of a copy): the
   *      lease must protect it. S1: the block is not reclaimed, and holds the data that was
   *      published under (le, lg). */
  :: atomic { ph[r] == HELD && LEASE_OK(r) ->
       read_block(r, lb[r], tmp);
       assert(bst[lb[r]] == B_PUB || bst[lb[r]] == B_RET);
       assert(DATA_OK(lb[r], le[r], lg[r], tmp));
       tmp = 0;
       ph[r] = COPYING }
  /* ---- the copy ends (late, maybe: a pause, the deadline passed, the block reclaimed and
   *      rewritten meanwhile), then ValidateAfterCopy: the deadline on the local clock, then
   *      Invalidate + re-read the entry. S2: a copy that passes both holds the right data. */
  :: atomic { ph[r] == COPYING ->
       read_block(r, lb[r], tmp);
#ifdef BUG_NO_VALIDATE_AFTER_COPY
       assert(DATA_OK(lb[r], le[r], lg[r], tmp));
#else
       if
       :: LEASE_OK(r) || NO_DEADLINE_CHECK ->
            read_entry_inv(r, le[r], g, b);
            if :: g == lg[r] || NO_GEN_CHECK -> assert(DATA_OK(lb[r], le[r], lg[r], tmp))
               :: else -> skip                                      /* kAborted: discarded */
            fi
       :: else -> skip                                     /* kDeadlineExceeded: discarded */
       fi;
#endif
       tmp = 0; g = 0; b = 0;
       ph[r] = HELD }

  /* ---- Renew(lease): now sampled, the lease still valid ... */
  :: atomic { ph[r] == HELD && LEASE_OK(r) -> ph[r] = RENEW }
  /* ... then the row written again (lease_seq + 1: version 1), Flush, FullFence; the new
   * deadline counts from the sample. The fixed Renew looks at the clock again after the
   * write: if the old deadline has passed by then, the owner may have judged the old row
   * expired and reclaimed the block while this write was on its way, so the lease is lost.
   * BUG_RENEW_NO_SECOND_LOOK: Renew without the second look, as prefix_host.cc had it until
   * SPIN found the reclaim (tests/prefix_test.cc, RenewThatStalledPastItsDeadline...). */
  :: atomic { ph[r] == RENEW ->
       C_lv[r] = 1; C_ldirty[r] = 1; flush_lease_row(r);
#ifdef BUG_RENEW_NO_SECOND_LOOK
       if :: true ->
#else
       if :: LF[r] == 0 && ALIVE(r) ->
#endif
             /* version 1 is now the current row: rename it 0 (LF moves with it) */
             LF[r] = (LF[r] > 0 -> LF[r] - 1 : 0);
             C_lv[r] = 0; M_lv[r] = 0;
             ph[r] = HELD
          :: else -> release_row(r)                                  /* kDeadlineExceeded */
       fi }

  /* ---- Release(lease) */
  :: atomic { ph[r] == HELD -> release_row(r) }

  /* ---- Heartbeat(): Invalidate + read the owner line: fenced => Rejoin; else credit the
   *      acknowledged beat (alive_until = its send time + host_ttl - margin); then a new beat
   *      in the host row (send time taken before the store), Flush, Fence. */
  :: atomic { ph[r] < DOWN ->
       if
       :: M_fen[r] >= C_inc[r] -> rejoin(r)
       :: else ->
            if :: M_ai[r] == C_inc[r] && M_ah[r] > HC[r] -> HC[r] = M_ah[r]
               :: else -> skip fi;
            C_hb[r] = 1; C_hdirty[r] = 1; flush_host_row(r);
#ifdef BUG_UNACKED_HEARTBEAT
            HC[r] = 1;                /* the host counts its own beat, acknowledged or not */
#endif
            skip
       fi }

  /* ---- time passes on host r's clock (a slow host, or a pause): a deadline arrives */
  :: atomic { ph[r] >= ACQ && ph[r] <= COPYING && LF[r] < (ph[r] == RENEW -> 2 : 1) -> LF[r]++ }
  :: atomic { ph[r] < DOWN && C_hb[r] > 0 -> hb_tick(r) }

  /* ---- crash: the host stops (to restart later, or for good); its caches (dirty lines
   *      too) and local state are lost */
  :: atomic { ph[r] < DOWN ->
       forget_lease(r);
#ifdef LIVENESS
       if :: ph[r] = DOWN :: ph[r] = DEAD fi;
#else
       ph[r] = DOWN;                        /* (DEAD: the same states, less the restart) */
#endif
       C_inc[r] = M_inc[r]; C_hb[r] = M_hb[r]; C_hdirty[r] = 0;
       C_lh[r] = M_lh[r]; C_le[r] = M_le[r]; C_lg[r] = M_lg[r]; C_li[r] = M_li[r];
       C_lv[r] = M_lv[r]; C_ldirty[r] = 0;
#ifdef KEEP_ENTRY_CACHE
       HE_p[r*NE] = 0; HE_gen[r*NE] = 0; HE_blk[r*NE] = 0;
       HE_p[r*NE+1] = 0; HE_gen[r*NE+1] = 0; HE_blk[r*NE+1] = 0;
#endif
#ifdef KEEP_BLOCK_CACHE
       HB_p[r*NB] = 0; HB_v[r*NB] = 0; HB_p[r*NB+1] = 0; HB_v[r*NB+1] = 0;
#endif
       LF[r] = 2; hb_tick(r) }
  /* ---- restart: Join again, with a new incarnation */
  :: atomic { ph[r] == DOWN -> rejoin(r) }
  od
}

/* =============================================================================================
 * The publisher (host 0); it does not fail in this model
 * ============================================================================================= */
active proctype Publisher() {
  bit b, k;
end_loop:
  do
  /* the previous request was applied (Invalidate + read its owner line: ring_head; a ring of
   * one slot); returned blocks are taken back (Heartbeat's return-ring collection); then a
   * block it holds is written (streaming stores + Fence: in memory at once) and
   * PUBLISH(key k, block b) posted: slot stored, Flush, Fence. */
  :: atomic { M_head == C_rs && npub < MAXPUB &&
              (pown[0] || M_ret[0] != ptaken[0] || pown[1] || M_ret[1] != ptaken[1]) ->
       if :: M_ret[0] != ptaken[0] -> ptaken[0] = M_ret[0]; pown[0] = 1 :: else -> skip fi;
       if :: M_ret[1] != ptaken[1] -> ptaken[1] = M_ret[1]; pown[1] = 1 :: else -> skip fi;
       if
       :: npub == 0 -> b = 0; k = 0     /* blocks and entries are symmetric: the first */
       :: else ->                       /* publish names block 0 and key 0             */
            if :: pown[0] -> b = 0
               :: pown[1] -> b = 1 fi;
            if :: k = 0 :: k = 1 fi
       fi;
       pown[b] = 0; bwr[b]++; npub++;
       if :: bst[b] == B_FREED -> bst[b] = B_REUSED :: else -> skip fi;
       C_rs = !C_rs; C_rk = k; C_rb = b; C_rdirty = 1; flush_request();
       b = 0; k = 0 }
#ifdef DUP_REQUEST
  /* once: a PUBLISH of a block that is already published (a replayed or forged request) */
  :: atomic { M_head == C_rs && !dupsent && (bst[0] == B_PUB || bst[1] == B_PUB) ->
       if :: bst[0] == B_PUB -> b = 0 :: bst[1] == B_PUB -> b = 1 fi;
       if :: k = 0 :: k = 1 fi;
       C_rs = !C_rs; C_rk = k; C_rb = b; C_rdirty = 1; flush_request();
       dupsent = 1; b = 0; k = 0 }
#endif
  od
}

/* =============================================================================================
 * The owner (the reclaimer): PrefixOwner::Step in a loop
 * ============================================================================================= */
inline return_block(b) { O_ret[b] = !O_ret[b]; O_rdirty[b] = 1; flush_ret(b) }

/* the scan's verdict on reader h's row: does a live, unexpired lease name (e, g)? */
inline scan_row(h, e, g) {
#ifdef BUG_SCAN_ALL_ROWS
  if :: M_lh[h] && M_le[h] == e && M_lg[h] == g -> live = 1 :: else -> skip fi
#else
  if
  :: HOSTLIVE(h) && M_lh[h] && M_li[h] == M_inc[h] && M_le[h] == e && M_lg[h] == g ->
       if
       :: M_lv[h] < LF[h] ->                 /* lease_seq unchanged for lease_ttl: expired  */
#ifdef LIVENESS
            skip                             /* (time passes: the owner's clock gets there) */
#else
            if :: skip :: live = 1 fi        /* ... or the owner's clock is not there yet   */
#endif
       :: else -> live = 1
       fi
  :: else -> skip
  fi
#endif
}

/* Reclaim, first half, for entry e: RETIRED past grace and no live lease names
 * (e, gen - 1) in the scan (Invalidate + read every live host's rows) => due for freeing */
inline reclaim_scan(e) {
  g = O_gen[e];
#ifdef BUG_NO_GRACE
  if :: RET(g) ->
#else
  if :: RET(g) && graced[e] ->
#endif
       live = 0;
       scan_row(0, e, g - 1);
       scan_row(1, e, g - 1);
       due[e] = !live
  :: else -> skip
  fi;
  g = 0; live = 0
}
/* ... second half, a step later (hosts act in between): the block goes back to its
 * publisher (return ring) and the entry becomes TOMBSTONE(gen + 1), Flush, Fence */
inline reclaim_free(e) {
  if
  :: due[e] ->
       g = O_gen[e]; b = O_blk[e];
       /* S3: never freed while a host holds a valid lease on it */
       assert(!(RELIES(0) && le[0] == e && lg[0] == g - 1));
       assert(!(RELIES(1) && le[1] == e && lg[1] == g - 1));
       O_gen[e] = g + 1; O_edirty[e] = 1; flush_entry(e);
       bst[b] = B_FREED;
       return_block(b);
       due[e] = 0; g = 0; b = 0
  :: else -> skip
  fi
}

/* FenceExpiredHosts for reader h, first half: Invalidate + read the host row, decide */
inline fence_read(h) {
  if
  :: HOSTLIVE(h) ->
       fh = h; ri = M_inc[h]; rb = M_hb[h]; dec = D_ACK;
       if
       :: rb == 0 ->                         /* the row unchanged for host_ttl on our clock */
#if defined(BUG_NEVER_FENCE)
            skip
#elif defined(LIVENESS)
            dec = D_FENCE
#else
            if :: dec = D_FENCE :: skip fi   /* ... or our clock is not there yet           */
#endif
       :: else -> skip
       fi
  :: else -> skip
  fi
}
/* ... second half: write the owner line: fenced_incarnation, or the acknowledgement */
inline fence_write(h) {
  if
  :: dec == D_FENCE -> O_fen[h] = ri; O_odirty[h] = 1; flush_owner_line(h)
  :: dec == D_ACK && (O_ai[h] != ri || O_ah[h] != rb) ->
       O_ai[h] = ri; O_ah[h] = rb; O_odirty[h] = 1; flush_owner_line(h)
  :: else -> skip
  fi;
  fh = 0; ri = 0; rb = 0; dec = D_NONE
}

active proctype Owner() {
  byte e, g;
  bit b, live;
end_loop:
  do
  :: atomic {
       fence_write(1);

       /* grace: an entry retired in an earlier Step is past grace now */
       graced[0] = RET(O_gen[0]); graced[1] = RET(O_gen[1]);

       /* ApplyRequests: host 0's slot (Invalidate + read); a new seq is applied */
       if
       :: M_rs != O_head ->
            e = M_rk; b = M_rb;
            if
#ifndef BUG_DUP_REF
            :: NAMED(b) -> skip                          /* a block named twice: rejected */
#endif
            :: else ->
                 if
                 :: LIVEG(O_gen[e]) -> return_block(b)   /* key present / no free slot    */
                 :: else ->                              /* insert PUBLISHED(gen + 1)     */
                      O_gen[e] = O_gen[e] + 1; O_blk[e] = b; O_edirty[e] = 1; flush_entry(e);
                      bst[b] = B_PUB; bent[b] = e; bgen[b] = O_gen[e]; bver[b] = bwr[b]
                 fi
            fi;
            O_head = M_rs; O_hdirty = 1; flush_head();
            e = 0; b = 0
       :: else -> skip
       fi;

       /* Evict / RetireKey / a RETIRE request: PUBLISHED(g) -> RETIRED(g + 1), Flush,
        * FullFence; the grace period starts */
       if
       :: PUB(O_gen[0]) -> e = 0
       :: PUB(O_gen[1]) -> e = 1
       :: true -> e = NE
       fi;
       if
       :: e < NE ->
            O_gen[e] = O_gen[e] + 1; O_edirty[e] = 1;
#ifndef BUG_NO_FLUSH_RETIRE
            flush_entry(e);
#endif
            bst[O_blk[e]] = B_RET
       :: else -> skip
       fi;
       e = 0;

       /* Reclaim: one scan of the live hosts' lease rows */
       reclaim_scan(0);
       reclaim_scan(1);

       /* FenceExpiredHosts: read reader 0's host row ... */
       fence_read(0) }
     /* ... the host may act before the owner writes its owner line, or frees what the
      * scan found unleased */
     atomic { reclaim_free(0); reclaim_free(1); fence_write(0); fence_read(1) }
  od
}

/* =============================================================================================
 * The caches: a dirty line may be written back, a clean copy dropped, at any time
 * ============================================================================================= */
active proctype Evictor() {
end_loop:
  do
  :: atomic { C_ldirty[0] -> flush_lease_row(0) }
  :: atomic { C_ldirty[1] -> flush_lease_row(1) }
  :: atomic { C_hdirty[0] -> flush_host_row(0) }
  :: atomic { C_hdirty[1] -> flush_host_row(1) }
  :: atomic { O_edirty[0] -> flush_entry(0) }
  :: atomic { O_edirty[1] -> flush_entry(1) }
  :: atomic { O_odirty[0] -> flush_owner_line(0) }
  :: atomic { O_odirty[1] -> flush_owner_line(1) }
  :: atomic { O_hdirty -> flush_head() }
  :: atomic { O_rdirty[0] -> flush_ret(0) }
  :: atomic { O_rdirty[1] -> flush_ret(1) }
  :: atomic { C_rdirty -> flush_request() }
#ifdef KEEP_ENTRY_CACHE
  :: atomic { HE_p[0] -> HE_p[0] = 0; HE_gen[0] = 0; HE_blk[0] = 0 }
  :: atomic { HE_p[1] -> HE_p[1] = 0; HE_gen[1] = 0; HE_blk[1] = 0 }
  :: atomic { HE_p[2] -> HE_p[2] = 0; HE_gen[2] = 0; HE_blk[2] = 0 }
  :: atomic { HE_p[3] -> HE_p[3] = 0; HE_gen[3] = 0; HE_blk[3] = 0 }
#endif
#ifdef FULL_CACHES
  :: atomic { HB_p[0] -> HB_p[0] = 0; HB_v[0] = 0 }
  :: atomic { HB_p[1] -> HB_p[1] = 0; HB_v[1] = 0 }
  :: atomic { HB_p[2] -> HB_p[2] = 0; HB_v[2] = 0 }
  :: atomic { HB_p[3] -> HB_p[3] = 0; HB_v[3] = 0 }
#endif
  od
}

/* =============================================================================================
 * S4, index invariants: a block is named by one live entry at most, and a block a live entry
 * names is not with its publisher (else it could be handed out twice)
 * ============================================================================================= */
#define INV_ONE_NAME  (!(LIVEG(O_gen[0]) && LIVEG(O_gen[1]) && O_blk[0] == O_blk[1]))
#define INV_NOT_OWNED (!(pown[0] && NAMED(0)) && !(pown[1] && NAMED(1)))
active proctype Monitor() {
  atomic { !(INV_ONE_NAME && INV_NOT_OWNED) -> assert(INV_ONE_NAME && INV_NOT_OWNED) }
}

init {
  byte i;
  atomic {
    for (i : 0 .. NR - 1) {
      C_inc[i] = 1; M_inc[i] = 1; C_hb[i] = 1; M_hb[i] = 1; C_li[i] = 1; M_li[i] = 1
    }
    pown[0] = 1; pown[1] = 1;
    run Reader(0);
#ifndef IDLE_HOST2
    run Reader(1)
#endif
    skip
  }
}

/* =============================================================================================
 * Liveness (compile with -DLIVENESS; pan -a -f). L1: once a retired entry is named by no
 * lease and no pending acquire of a host that is up (only crashed hosts' rows may still name
 * it), it is eventually reclaimed. L2: a crashed host is eventually fenced (or restarts).
 * ============================================================================================= */
#define NAMES(r, e) ((M_lh[r] && M_le[r] == e && M_lg[r] + 1 == O_gen[e]) || \
                     (ph[r] >= LOOKED && ph[r] <= COPYING && le[r] == e && lg[r] + 1 == O_gen[e]))
#define ORPHANED(e) (RET(O_gen[e]) && (ph[0] >= DOWN || !NAMES(0, e)) && \
                     (ph[1] >= DOWN || !NAMES(1, e)))
ltl reclaim0 { [] (ORPHANED(0) -> <> !RET(O_gen[0])) }
ltl reclaim1 { [] (ORPHANED(1) -> <> !RET(O_gen[1])) }
ltl live     { [] (ORPHANED(0) -> <> !RET(O_gen[0])) && [] (ORPHANED(1) -> <> !RET(O_gen[1])) &&
               [] ((ph[0] == DEAD && M_inc[0] > O_fen[0]) -> <> (M_inc[0] <= O_fen[0])) }
ltl fenced0  { [] ((ph[0] == DEAD && M_inc[0] > O_fen[0]) -> <> (M_inc[0] <= O_fen[0])) }
