/*
 * prefix.pml -- Promela model of the shared-prefix protocol of docs/coherence.md, as the
 * code in coherence/src/prefix_host.cc and prefix_owner.cc implements it, on memory that
 * is NOT coherent between hosts. docs/model.md maps every step below to the code and lists
 * what was checked. Run everything with coherence/model/check.sh.
 *
 * Processes
 *   Owner      PrefixOwner::Step: ApplyRequests, FenceExpiredHosts, Evict/Retire, Reclaim
 *   Publisher  host 0: writes blocks, posts PUBLISH requests, takes returned blocks back
 *   Reader(r)  hosts 1 and 2 (r = 0, 1): Lookup, Acquire, copy + ValidateAfterCopy, Renew,
 *              Release, Heartbeat (+ Rejoin), and the faults: crash, restart, pause
 *   Evictor    the caches: writes a dirty line back, or drops a clean line, at any time
 *   Monitor    the index invariants (no block named twice, no named block handed back)
 *
 * Non-coherent memory. Every shared line has one writer. The writer's copy (its cache) and
 * memory are separate variables: C_* / O_* (writer's cache, plus a dirty bit) and M_*
 * (memory). A store changes the cache only; Flush copies a dirty line to memory; the
 * Evictor may also copy it at any time (a cache evicting a dirty line). A reader's Invalidate
 * + load takes the value memory holds at that step. Readers that skip the Invalidate (bug
 * variants, or -DFULL_CACHES) read through a cached copy (HE_*, HB_*) that the Evictor may
 * drop at any time. Without those switches a reader's copy is refetched at every read, so it
 * is dead between reads and is not kept (the same as the cache dropping it right after the
 * read, which the model allows anyway); see docs/model.md "Reductions".
 *
 * Time. There are no clocks. What the owner may conclude from its own clock is encoded by
 * ghost "freshness thresholds" kept with each reader, which only move forward, at any time
 * (a host is slow, or paused, or its deadline simply arrives):
 *   LF[r]  lease versions >= LF[r] are still before their local deadline
 *          (version 0: the current lease row; version 1: the row being renewed)
 *   HF[r]  heartbeats >= HF[r] are still before their local deadline (send time + host_ttl
 *          - margin)
 * The owner may treat a lease row version v as expired only if v < LF[r], and may fence a
 * host whose heartbeat in memory is b only if b < HF[r]. That is the assumption "the owner's
 * TTL fires only after the host's own deadline for the same write" (bounded clock-rate drift,
 * margin), docs/model.md "Assumptions".
 */

/* ---- sizes and bounds ------------------------------------------------------------------ */
#define NR      2       /* reader hosts: hosts 1 and 2 of the domain (host 0 publishes)    */
#define NE      2       /* index entries; key k lives in entry k (probing abstracted)      */
#define NB      2       /* blocks                                                          */
#define MAXWR   2       /* data writes per block: bounds publish/retire/reclaim/reuse      */
#define MAXINC  2       /* incarnations per reader (join + one rejoin or restart)          */
#define MAXHB   2       /* heartbeats per incarnation (beat 1 is sent by the join itself)  */

/* entry_gen carries the state: 0 EMPTY, 3k+1 PUBLISHED, 3k+2 RETIRED, 3k+3 TOMBSTONE */
#define PUB(g)       ((g) % 3 == 1)
#define RET(g)       ((g) % 3 == 2)
#define LIVEG(g)     (PUB(g) || RET(g))

/* reader phases */
#define IDLE     0
#define LOOKED   1      /* Lookup returned (le, lg, lb)                                    */
#define ACQ      2      /* Acquire: lease row written, flushed, full fence                 */
#define HELD     3      /* Acquire re-validated the entry: the lease is held               */
#define RENEW    4      /* Renew: clock sampled, row not yet written                       */
#define COPYING  5      /* read(): copy started while the lease was valid                  */
#define COPIED   6      /* copy done, ValidateAfterCopy pending                            */
#define DOWN     7      /* crashed (or stopped for good)                                   */

/* block life (ghost) */
#define B_OWN    0      /* with the publisher, never published since it was written        */
#define B_PUB    1      /* named by a PUBLISHED entry                                      */
#define B_RET    2      /* named by a RETIRED entry                                        */
#define B_FREED  3      /* reclaimed: on its way back to the publisher, data still intact  */
#define B_REUSED 4      /* the publisher wrote new data into it                            */

/* owner decisions in FenceExpiredHosts */
#define D_NONE   0
#define D_ACK    1
#define D_FENCE  2

#if defined(FULL_CACHES) || defined(BUG_STALE_REVALIDATE)
#define KEEP_ENTRY_CACHE 1
#endif
#if defined(FULL_CACHES) || defined(BUG_NO_INVALIDATE_BLOCK)
#define KEEP_BLOCK_CACHE 1
#endif

/* Informational variants: ValidateAfterCopy without one of its two checks. */
#ifndef NO_DEADLINE_CHECK
#define NO_DEADLINE_CHECK 0
#endif
#ifndef NO_GEN_CHECK
#define NO_GEN_CHECK 0
#endif

/* ---- index entries: owner-written --------------------------------------------------------- */
byte O_gen[NE]; bit O_blk[NE]; bit O_edirty[NE];     /* owner's cache (authoritative)      */
byte M_gen[NE]; bit M_blk[NE];                       /* memory                             */
bit  graced[NE];                                     /* retired at least one Step ago      */

/* ---- owner lines: owner-written ---------------------------------------------------------- */
byte O_fen[NR]; byte O_ai[NR]; byte O_ah[NR]; bit O_odirty[NR];  /* fenced_incarnation,     */
byte M_fen[NR]; byte M_ai[NR]; byte M_ah[NR];                    /* acked_incarnation/beat  */
bit  O_head; bit O_hdirty; bit M_head;               /* ring_head of the publisher (host 0) */
bit  O_ret[NB]; bit O_rdirty[NB]; bit M_ret[NB];     /* return ring: one toggle per block   */

/* ---- host rows and lease rows: reader-written (one lease row per reader) ----------------- */
byte C_inc[NR]; byte C_hb[NR]; bit C_hdirty[NR];     /* reader's cache of its host row     */
byte M_inc[NR]; byte M_hb[NR];
bit  C_lh[NR]; bit C_le[NR]; byte C_lg[NR]; byte C_li[NR]; bit C_lv[NR]; bit C_ldirty[NR];
bit  M_lh[NR]; bit M_le[NR]; byte M_lg[NR]; byte M_li[NR]; bit M_lv[NR];
                                                     /* held, entry, entry_gen, incarnation,
                                                        lease_seq (0 current, 1 renewing)   */
/* ---- request slot: publisher-written ------------------------------------------------------ */
bit  C_rs; bit C_rk; bit C_rb; bit C_rdirty;         /* seq (toggle), key, block             */
bit  M_rs; bit M_rk; bit M_rb;

/* ---- reader-local state -------------------------------------------------------------------- */
byte ph[NR];
bit  le[NR]; byte lg[NR]; bit lb[NR];                /* the lease: entry, gen, block         */
byte cv[NR];                                          /* data version the copy saw            */
byte HC[NR];                                          /* highest acknowledged heartbeat       */
byte HF[NR];                                          /* ghost: heartbeats >= HF still fresh  */
byte LF[NR];                                          /* ghost: lease versions >= LF fresh    */
#ifdef KEEP_ENTRY_CACHE
bit  HE_p[NR*NE]; byte HE_gen[NR*NE]; bit HE_blk[NR*NE];
#endif
#ifdef KEEP_BLOCK_CACHE
bit  HB_p[NR*NB]; byte HB_v[NR*NB];
#endif

/* ---- publisher-local state ----------------------------------------------------------------- */
bit  pown[NB];                                        /* blocks the publisher holds           */
bit  ptaken[NB];                                      /* return toggles consumed              */
bit  pwait;                                           /* a request is in flight               */
#ifdef DUP_REQUEST
bit  dupsent;
#endif

/* ---- the blocks (ghost) ------------------------------------------------------------------ */
byte bwr[NB];                                         /* data version in memory (writes)      */
byte bst[NB];                                         /* B_*                                  */
bit  bent[NB]; byte bgen[NB]; byte bver[NB];          /* last publish: entry, gen, version    */

/* ---- predicates ---------------------------------------------------------------------------- */
#define ALIVE(r)    (HC[r] >= HF[r])                  /* now <= alive_until                   */
#define LEASE_OK(r) (LF[r] == 0 && ALIVE(r))          /* now <= lease.deadline_ms             */
#define RELIES(r)   (ph[r] >= HELD && ph[r] <= COPIED && LEASE_OK(r))
#define HOSTLIVE(h) (M_inc[h] > O_fen[h])             /* PrefixOwner::HostLive                */
/* the data a reader of (e, g) on block b may use: published under (e, g) and not rewritten */
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
/* PrefixHost::WriteLeaseRow: store (cache), Flush, FullFence */
inline write_lease_row(r, held, e, g, v) {
  C_lh[r] = held; C_le[r] = e; C_lg[r] = g; C_li[r] = C_inc[r]; C_lv[r] = v; C_ldirty[r] = 1;
  flush_lease_row(r)
}

/* Reader r reads entry k into (g, b). read_entry_inv: Invalidate, then load. */
#ifdef KEEP_ENTRY_CACHE
inline read_entry_inv(r, k, g, b) {
  HE_p[r*NE+k] = 1; HE_gen[r*NE+k] = M_gen[k]; HE_blk[r*NE+k] = M_blk[k];
  g = HE_gen[r*NE+k]; b = HE_blk[r*NE+k]
}
inline read_entry_cached(r, k, g, b) {   /* a load with no Invalidate: may hit a stale line */
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

/* Reader r copies block b: the data version it gets. */
#ifdef KEEP_BLOCK_CACHE
inline read_block(r, b, v) {
#ifdef BUG_NO_INVALIDATE_BLOCK
  if :: !HB_p[r*NB+b] -> HB_p[r*NB+b] = 1; HB_v[r*NB+b] = bwr[b] :: else -> skip fi;
#else
  HB_p[r*NB+b] = 1; HB_v[r*NB+b] = bwr[b];          /* Invalidate the block's lines first */
#endif
  v = HB_v[r*NB+b]
}
#else
inline read_block(r, b, v) { v = bwr[b] }
#endif

/* ---- reader helpers ------------------------------------------------------------------------ */
inline forget_lease(r) {
  ph[r] = IDLE; le[r] = 0; lg[r] = 0; lb[r] = 0; cv[r] = 0; LF[r] = 0
}
inline release_row(r) {             /* PrefixHost::Release: held = 0, Flush, FullFence */
  write_lease_row(r, 0, 0, 0, 0); forget_lease(r)
}
/* PrefixHost::Rejoin (also Join after a restart): new incarnation above the row's and the
 * fenced one, lease rows cleared first, then the host row with a fresh heartbeat; nothing is
 * acknowledged for the new incarnation yet. Past MAXINC the host stops for good. */
inline rejoin(r) {
  tmp = (M_inc[r] > M_fen[r] -> M_inc[r] : M_fen[r]) + 1;
  if
  :: tmp <= MAXINC ->
       C_inc[r] = tmp;
       write_lease_row(r, 0, 0, 0, 0);
       C_hb[r] = 1; C_hdirty[r] = 1; flush_host_row(r);
       forget_lease(r); HC[r] = 0; HF[r] = 1
  :: else ->
       forget_lease(r); ph[r] = DOWN; HC[r] = 0; HF[r] = MAXHB + 1; LF[r] = 2
  fi;
  tmp = 0
}

/* =============================================================================================
 * Reader hosts
 * ============================================================================================= */
proctype Reader(byte r) {
  byte g, tmp; bit b, k;
end_loop:
  do
  /* ---- Lookup(ns, key): Invalidate + read entry k; a PUBLISHED match is a hit. No lease. */
  :: atomic { ph[r] == IDLE ->
       if :: k = 0 :: k = 1 fi;
       read_entry_inv(r, k, g, b);
       if :: PUB(g) -> le[r] = k; lg[r] = g; lb[r] = b; ph[r] = LOOKED
          :: else -> skip fi;
       g = 0; b = 0; k = 0 }
  :: atomic { ph[r] == LOOKED -> forget_lease(r) }          /* the caller gives up */

  /* ---- Acquire(hit), first half: alive (an acknowledged heartbeat), now sampled, lease row
   *      {held, entry, gen, incarnation, seq} stored, Flush, FullFence. */
  :: atomic { ph[r] == LOOKED && ALIVE(r) ->
       LF[r] = 0;
       C_lh[r] = 1; C_le[r] = le[r]; C_lg[r] = lg[r]; C_li[r] = C_inc[r]; C_lv[r] = 0;
       C_ldirty[r] = 1;
#ifndef BUG_NO_FLUSH_LEASE
       flush_lease_row(r);
#endif
       ph[r] = ACQ }
  /* ---- Acquire, second half: Invalidate + re-read the entry; still PUBLISHED(gen)? */
  :: atomic { ph[r] == ACQ ->
#ifdef BUG_NO_REVALIDATE
       g = lg[r];
#else
       read_entry_reval(r, le[r], g, b);
#endif
       if :: g == lg[r] -> ph[r] = HELD
          :: else -> release_row(r)                         /* kNotFound: row cleared */
       fi;
       g = 0; b = 0 }

  /* ---- read(lease): use the data under a valid lease (zero-copy use, or the start of a
   *      copy). The lease must protect it: the block is still named by (le, lg) and intact. */
  :: atomic { ph[r] == HELD && LEASE_OK(r) ->
       read_block(r, lb[r], tmp);
       assert(bst[lb[r]] == B_PUB || bst[lb[r]] == B_RET);  /* S1: not reclaimed      */
       assert(DATA_OK(lb[r], le[r], lg[r], tmp));          /* S1: not reused         */
       tmp = 0;
       ph[r] = COPYING }
  /* ---- the copy itself: may run late (pause), after the deadline, while the block is
   *      reclaimed and rewritten: the copy is whatever memory holds then. */
  :: atomic { ph[r] == COPYING -> read_block(r, lb[r], cv[r]); ph[r] = COPIED }
  /* ---- ValidateAfterCopy: deadline on the local clock, then Invalidate + re-read the
   *      entry. Only a copy that passes both is used. */
  :: atomic { ph[r] == COPIED ->
#ifdef BUG_NO_VALIDATE_AFTER_COPY
       assert(DATA_OK(lb[r], le[r], lg[r], cv[r]));        /* S2 */
#else
       if
       :: LEASE_OK(r) || NO_DEADLINE_CHECK ->
            read_entry_inv(r, le[r], g, b);
            if :: g == lg[r] || NO_GEN_CHECK ->
                    assert(DATA_OK(lb[r], le[r], lg[r], cv[r]))   /* S2: the copy is good */
               :: else -> skip                                     /* kAborted: discard   */
            fi
       :: else -> skip                                              /* expired: discard   */
       fi;
#endif
       cv[r] = 0; g = 0; b = 0;
       ph[r] = HELD }

  /* ---- Renew(lease): now sampled; the lease must still be valid ... */
  :: atomic { ph[r] == HELD && LEASE_OK(r) -> ph[r] = RENEW }
  /* ... then the row is written again (lease_seq + 1: version 1), Flush, FullFence. The new
   * deadline counts from the sample. The fixed Renew checks the clock again after the write:
   * the old deadline must not have passed (else the owner may already have judged the old
   * row expired and reclaimed the block while this write was on its way). */
  :: atomic { ph[r] == RENEW ->
       C_lv[r] = 1; C_ldirty[r] = 1; flush_lease_row(r);
#ifdef RENEW_AS_CODED
       if :: true ->
#else
       if :: LF[r] == 0 && ALIVE(r) ->
#endif
             /* version 1 becomes the current lease: renumber versions (1 -> 0) */
             LF[r] = (LF[r] > 0 -> LF[r] - 1 : 0);
             C_lv[r] = 0; M_lv[r] = 0;
             ph[r] = HELD
          :: else -> release_row(r)                                 /* kDeadlineExceeded */
       fi }

  /* ---- Release(lease) */
  :: atomic { ph[r] == HELD -> release_row(r) }

  /* ---- Heartbeat(): Invalidate + read the owner line: fenced => Rejoin; else note the
   *      acknowledged beat (alive_until = its send time + host_ttl - margin); then bump the
   *      heartbeat in the host row, Flush, Fence (the send time is taken before the store). */
  :: atomic { ph[r] != DOWN ->
       if
       :: M_fen[r] >= C_inc[r] -> rejoin(r)
       :: else ->
            if :: M_ai[r] == C_inc[r] && M_ah[r] > HC[r] -> HC[r] = M_ah[r]
               :: else -> skip fi;
            if :: C_hb[r] < MAXHB ->
                    C_hb[r]++; C_hdirty[r] = 1;
#ifndef BUG_NO_FLUSH_HEARTBEAT
                    flush_host_row(r);
#endif
#ifdef BUG_UNACKED_HEARTBEAT
                    HC[r] = C_hb[r];      /* docs/coherence.md as first written: own beat counts */
#endif
                    skip
               :: else -> skip fi
       fi }

  /* ---- time passes on this host's clock (slow host, or a pause): a deadline arrives */
  :: atomic { ph[r] >= ACQ && ph[r] <= COPIED && LF[r] < (ph[r] == RENEW -> 2 : 1) -> LF[r]++ }
  :: atomic { ph[r] != DOWN && HF[r] <= C_hb[r] -> HF[r]++ }

  /* ---- crash: the host stops; its cache (dirty lines included) and local state are lost */
  :: atomic { ph[r] != DOWN ->
       forget_lease(r); ph[r] = DOWN;
       C_inc[r] = M_inc[r]; C_hb[r] = M_hb[r]; C_hdirty[r] = 0;
       C_lh[r] = M_lh[r]; C_le[r] = M_le[r]; C_lg[r] = M_lg[r]; C_li[r] = M_li[r];
       C_lv[r] = M_lv[r]; C_ldirty[r] = 0;
       HC[r] = 0; HF[r] = MAXHB + 1; LF[r] = 2 }
  /* ---- restart: Join with a new incarnation (bounded by MAXINC; else down for good) */
  :: atomic { ph[r] == DOWN && (M_inc[r] > M_fen[r] -> M_inc[r] : M_fen[r]) < MAXINC ->
       rejoin(r) }
  od
}

/* =============================================================================================
 * The publisher (host 0): never fails in this model
 * ============================================================================================= */
active proctype Publisher() {
  bit b, k;
end_loop:
  do
  /* write a block it holds (streaming stores + Fence: in memory at once), then post
   * PUBLISH(key k, block b): request slot stored, Flush, Fence (ring_tail folded in) */
  :: atomic { !pwait && ((pown[0] && bwr[0] < MAXWR) || (pown[1] && bwr[1] < MAXWR)) ->
       if :: pown[0] && bwr[0] < MAXWR -> b = 0
          :: pown[1] && bwr[1] < MAXWR -> b = 1 fi;
       if :: k = 0 :: k = 1 fi;
       pown[b] = 0; bwr[b]++;
       if :: bst[b] == B_FREED -> bst[b] = B_REUSED :: else -> skip fi;
       C_rs = !C_rs; C_rk = k; C_rb = b; C_rdirty = 1; flush_request();
       pwait = 1; b = 0; k = 0 }
#ifdef DUP_REQUEST
  /* once: a PUBLISH naming a block that is already published (a replayed request) */
  :: atomic { !pwait && !dupsent && (bst[0] == B_PUB || bst[1] == B_PUB) ->
       if :: bst[0] == B_PUB -> b = 0 :: bst[1] == B_PUB -> b = 1 fi;
       if :: k = 0 :: k = 1 fi;
       C_rs = !C_rs; C_rk = k; C_rb = b; C_rdirty = 1; flush_request();
       pwait = 1; dupsent = 1; b = 0; k = 0 }
#endif
  /* Invalidate + read its owner line: the request was applied */
  :: atomic { pwait && M_head == C_rs -> pwait = 0 }
  /* Heartbeat's return-ring collection: a returned block is the publisher's again */
  :: atomic { M_ret[0] != ptaken[0] -> ptaken[0] = M_ret[0]; pown[0] = 1 }
  :: atomic { M_ret[1] != ptaken[1] -> ptaken[1] = M_ret[1]; pown[1] = 1 }
  od
}

/* =============================================================================================
 * The owner (reclaimer): PrefixOwner::Step in a loop
 * ============================================================================================= */
inline return_block(b) { O_ret[b] = !O_ret[b]; O_rdirty[b] = 1; flush_ret(b) }

/* the reclaim scan's verdict on reader h's row for (e, g): does it hold the entry? */
inline scan_row(h, e, g) {
#ifdef BUG_SCAN_ALL_ROWS
  if :: M_lh[h] && M_le[h] == e && M_lg[h] == g -> live = 1 :: else -> skip fi
#else
  if
  :: HOSTLIVE(h) && M_lh[h] && M_li[h] == M_inc[h] && M_le[h] == e && M_lg[h] == g ->
       if
       :: M_lv[h] < LF[h] ->                 /* lease_seq unchanged for lease_ttl: may be */
#ifdef LIVENESS
            skip                             /* expired (the owner's clock got there)     */
#else
            if :: skip :: live = 1 fi        /* ... or not yet                            */
#endif
       :: else -> live = 1
       fi
  :: else -> skip
  fi
#endif
}

active proctype Owner() {
  byte e, h, g, ri, rb, dec;
  bit b, live;
end_loop:
  do
  :: true ->
    /* ---- ApplyRequests (host 0's ring; its host row is always live here) ---------------- */
    atomic {
      e = 0;
      do :: e < NE -> graced[e] = RET(O_gen[e]); e++     /* grace: retired a Step ago */
         :: else -> break od;
      e = 0;
      if
      :: M_rs != O_head ->                                /* Invalidate + read the slot */
           e = M_rk; b = M_rb;
           if
#ifndef BUG_DUP_REF
           :: NAMED(b) -> skip                            /* a block named twice: rejected */
#endif
           :: else ->
                if
                :: LIVEG(O_gen[e]) -> return_block(b)      /* key present / no free slot */
                :: else ->                                 /* insert PUBLISHED(gen + 1)  */
                     O_gen[e] = O_gen[e] + 1; O_blk[e] = b; O_edirty[e] = 1; flush_entry(e);
                     bst[b] = B_PUB; bent[b] = e; bgen[b] = O_gen[e]; bver[b] = bwr[b]
                fi
           fi;
           O_head = M_rs; O_hdirty = 1; flush_head();
           e = 0; b = 0
      :: else -> skip
      fi
    }

    /* ---- FenceExpiredHosts: per reader, Invalidate + read the host row (one step), then
     *      write the owner line (the next step: the host may act in between) ------------- */
    h = 0;
    do
    :: h < NR ->
       atomic {
         if
         :: HOSTLIVE(h) ->
              ri = M_inc[h]; rb = M_hb[h]; dec = D_ACK;
              if
              :: rb < HF[h] ->                       /* unchanged for host_ttl on our clock */
#ifdef BUG_NEVER_FENCE
                   skip
#elif defined(LIVENESS)
                   dec = D_FENCE
#else
                   if :: dec = D_FENCE :: skip fi
#endif
              :: else -> skip
              fi
         :: else -> dec = D_NONE
         fi }
       atomic {
         if
         :: dec == D_FENCE -> O_fen[h] = ri; O_odirty[h] = 1; flush_owner_line(h)
         :: dec == D_ACK && (O_ai[h] != ri || O_ah[h] != rb) ->
              O_ai[h] = ri; O_ah[h] = rb; O_odirty[h] = 1; flush_owner_line(h)
         :: else -> skip
         fi;
         dec = D_NONE; ri = 0; rb = 0; h++ }
    :: else -> h = 0; break
    od;

    /* ---- Evict / RetireKey / RETIRE request: PUBLISHED(g) -> RETIRED(g + 1), Flush,
     *      FullFence; the grace period starts ------------------------------------------------ */
    atomic {
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
           bst[O_blk[e]] = B_RET; graced[e] = 0
      :: else -> skip
      fi;
      e = 0 }

    /* ---- Reclaim: each RETIRED entry past grace: Invalidate + scan every live host's rows
     *      (HostLive, same incarnation, held, unexpired, names (e, g - 1)); none => the entry
     *      becomes TOMBSTONE(g + 1) and the block goes back to its publisher -------------- */
    e = 0;
    do
    :: e < NE ->
       atomic {
         g = O_gen[e];
#ifdef BUG_NO_GRACE
         if :: RET(g) ->
#else
         if :: RET(g) && graced[e] ->
#endif
              live = 0;
              scan_row(0, e, g - 1);
              scan_row(1, e, g - 1);
              if
              :: !live ->
                   b = O_blk[e];
                   /* S3: never freed while a host holds a valid lease on it */
                   assert(!(RELIES(0) && le[0] == e && lg[0] == g - 1));
                   assert(!(RELIES(1) && le[1] == e && lg[1] == g - 1));
                   O_gen[e] = g + 1; O_edirty[e] = 1; flush_entry(e);
                   bst[b] = B_FREED;
                   return_block(b)
              :: else -> skip
              fi
            :: else -> skip
         fi;
         g = 0; b = 0; live = 0; e++ }
    :: else -> e = 0; break
    od
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
#ifdef KEEP_ENTRY_CACHE
  :: atomic { HE_p[0] -> HE_p[0] = 0; HE_gen[0] = 0; HE_blk[0] = 0 }
  :: atomic { HE_p[1] -> HE_p[1] = 0; HE_gen[1] = 0; HE_blk[1] = 0 }
  :: atomic { HE_p[2] -> HE_p[2] = 0; HE_gen[2] = 0; HE_blk[2] = 0 }
  :: atomic { HE_p[3] -> HE_p[3] = 0; HE_gen[3] = 0; HE_blk[3] = 0 }
#endif
#ifdef KEEP_BLOCK_CACHE
  :: atomic { HB_p[0] -> HB_p[0] = 0; HB_v[0] = 0 }
  :: atomic { HB_p[1] -> HB_p[1] = 0; HB_v[1] = 0 }
  :: atomic { HB_p[2] -> HB_p[2] = 0; HB_v[2] = 0 }
  :: atomic { HB_p[3] -> HB_p[3] = 0; HB_v[3] = 0 }
#endif
  od
}

/* =============================================================================================
 * Index invariants (S4): a block is named by one live entry at most, and a named block is
 * never with its publisher (handed out twice)
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
      C_inc[i] = 1; M_inc[i] = 1; C_hb[i] = 1; M_hb[i] = 1; HF[i] = 1;
      C_li[i] = 1; M_li[i] = 1;
    }
    pown[0] = 1; pown[1] = 1;
    run Reader(0); run Reader(1)
  }
}

/* =============================================================================================
 * Liveness (check with -DLIVENESS, pan -a -f): once a retired entry is named by no lease of a
 * host that is up (only crashed hosts' rows still name it), it is eventually reclaimed.
 * ============================================================================================= */
#define NAMES(r, e) ((M_lh[r] && M_le[r] == e && M_lg[r] + 1 == O_gen[e]) || \
                     (ph[r] >= LOOKED && ph[r] <= COPIED && le[r] == e && lg[r] + 1 == O_gen[e]))
#define ORPHANED(e) (RET(O_gen[e]) && (ph[0] == DOWN || !NAMES(0, e)) && \
                     (ph[1] == DOWN || !NAMES(1, e)))
ltl reclaim0 { [] (ORPHANED(0) -> <> !RET(O_gen[0])) }
ltl reclaim1 { [] (ORPHANED(1) -> <> !RET(O_gen[1])) }
/* a crashed host is eventually fenced (or restarts) */
ltl fenced0 { [] ((ph[0] == DOWN && M_inc[0] > O_fen[0]) -> <> (ph[0] != DOWN || M_inc[0] <= O_fen[0])) }
