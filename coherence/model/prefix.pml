/*
 * prefix.pml -- Promela model of the shared-prefix protocol of docs/coherence.md, as
 * coherence/src/prefix_host.cc and prefix_owner.cc implement it, on memory that is NOT
 * coherent between hosts. docs/model.md maps every step to the code, states the assumptions
 * and lists what was checked; coherence/model/check.sh runs every check.
 *
 * Processes (3 hosts of one domain, its owner, and time)
 *   Owner      PrefixOwner::Step: ApplyRequests, FenceExpiredHosts, Retire, Reclaim
 *              (ScanLeases, ReturnBlock); it may crash between any two of its shared
 *              stores, and a new owner then starts from shared state only (Open)
 *   Publisher  host 0: writes blocks, posts PUBLISH requests, collects returned blocks and
 *              frees them (generation-checked); it may crash, also between the request slot
 *              and the ring_tail that announces it, and rejoin as a new incarnation
 *   Reader(r)  hosts 1 and 2 (r = 0, 1): Lookup, Acquire, read + ValidateAfterCopy, Renew,
 *              Release, Heartbeat (+ Rejoin); faults: crash, restart, pause
 *   Clock      the lease clock: one tick ages every lease-time stamp of hosts and owner
 *   Evictor    the caches: a dirty line is written back, a clean copy dropped, at any time
 *   Monitor    index invariants: no ref named by two live entries; a published ref's
 *              block is allocated and holds the data it was published with
 *
 * Non-coherent memory. Every shared line has one writer. Where a store can sit in the
 * writer's cache for a while (lease rows, host rows, the index entries), the cached copy
 * (C_*, O_*, with a dirty bit) and memory (M_*) are separate variables: a store changes the
 * cache only; Flush copies a dirty line to memory; the Evictor may also copy it at any time.
 * Lines that the code writes with WriteShared (store + Flush + Fence) and that no bug variant
 * leaves unflushed (owner lines, return slot, request slot, the publisher's host row) are
 * one variable: memory. A reader's Invalidate + load gets what memory holds at that step. A
 * load with no Invalidate goes through the reader's cached copy (HE_*, HB_*), which the
 * Evictor may drop at any time; those copies are kept only where some step reads without
 * Invalidate (the bug variants, and -DFULL_CACHES).
 *
 * Lease time is explicit. A global clock ticks (process Clock); every lease-time stamp is
 * kept as its age in ticks, saturating. lease_ttl = 3 ticks, margin = 1 tick: a host uses a
 * lease while the age of its clock sample is <= 2 (deadline = sample + ttl - margin); the
 * owner judges a lease row expired once the age of the owner-clock time it first saw the
 * row's current stamp (changed_at) is >= 4 (now - changed_at > ttl). Where the owner takes
 * that sample (after its read of the row: the fixed code; before it: BUG_SAMPLE_BEFORE_READ)
 * is modelled: a sample taken before a read credits a row written between the two with an
 * earlier time than its writer's own sample. Host clocks and the owner's clock run at the
 * same rate (a rate difference below the margin is what the margin absorbs).
 * Heartbeat time (host liveness and fencing) keeps the label abstraction (hb_tick): the
 * owner fences on a beat only when the beat is past its sender's deadline -- that is the
 * read-then-sample order assumed, not checked, for FenceExpiredHosts (docs/model.md).
 */

/* ---- sizes and bounds ---------------------------------------------------------------------- */
#define NR      2       /* reader hosts: hosts 1 and 2 of the domain (host 0 publishes)        */
#define NE      2       /* index entries; key k lives in entry k (probing abstracted)          */
#define NB      2       /* blocks                                                              */
#ifndef MAXPUB
#define MAXPUB  2       /* PUBLISH requests in all: bounds entry_gen and block versions        */
#endif
#ifndef MAXOCRASH
#define MAXOCRASH 1     /* owner crashes in a run                                              */
#endif
#ifndef MAXPCRASH
#define MAXPCRASH 1     /* publisher crashes in a run (its incarnation labels are exact at 1)  */
#endif

/* lease clock: ages in ticks */
#define HOST_LAST  2    /* a host uses a lease while its sample's age <= ttl - margin          */
#define HOST_CAP   3    /* ... so ages past 2 are all alike                                    */
#define OWNER_EXP  4    /* the owner: expired once now - changed_at > ttl (3)                  */

/* entry_gen carries the state: 0 EMPTY, 3k+1 PUBLISHED, 3k+2 RETIRED, 3k+3 TOMBSTONE */
#define PUB(g)       ((g) % 3 == 1)
#define RET(g)       ((g) % 3 == 2)
#define LIVEG(g)     (PUB(g) || RET(g))

/* reader phases */
#define IDLE     0
#define LOOKED   1      /* Lookup returned (le, lg, lb, lv)                                    */
#define ACQ      2      /* Acquire: lease row stored, flushed, full fence; not re-validated    */
#define HELD     3      /* Acquire re-validated the entry: the lease is held                   */
#define RENEW    4      /* Renew: clock sampled, the row not yet written again                 */
#define COPYING  5      /* a read started under a valid lease; the copy not yet validated      */
#define DOWN     6      /* crashed; will restart (Join again)                                  */
#define DEAD     7      /* crashed for good                                                    */

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
/* {entry_gen, ref = (block, block generation)}; the owner's cache is also its index_ copy    */
byte O_gen[NE]; bit O_blk[NE]; byte O_ver[NE]; bit O_edirty[NE];
byte M_gen[NE]; bit M_blk[NE]; byte M_ver[NE];

/* ---- owner lines (WriteShared: memory only) ----------------------------------------------- */
byte OL_fen[NR]; byte OL_ai[NR]; byte OL_ah[NR];     /* readers: fenced_inc, acked inc/beat   */
bit  OL_head;                                         /* host 0: ring_head (a one-slot ring)   */
bit  OL_rt;                                           /* host 0: return_tail (one-slot ring)   */

/* ---- return slot of host 0 (WriteShared): seq, ref ----------------------------------------- */
bit  RS_sq; bit RS_b; byte RS_v;

/* ---- host rows and lease rows of the readers: written by reader r ------------------------- */
byte C_inc[NR]; byte C_hb[NR]; bit C_hdirty[NR];      /* incarnation, heartbeat (label)       */
byte M_inc[NR]; byte M_hb[NR];
bit  C_lh[NR]; bit C_le[NR]; byte C_lg[NR]; byte C_li[NR]; bit C_ldirty[NR];
bit  M_lh[NR]; bit M_le[NR]; byte M_lg[NR]; byte M_li[NR];
                                                /* held, entry, entry_gen, incarnation      */

/* ---- host 0 (the publisher): host row and request slot (WriteShared) ---------------------- */
bit  P_inc;                   /* incarnation label in the row: 1 = the newest, 0 = an older one */
bit  P_tail;                  /* ring_tail                                                      */
bit  P_ack;                   /* return_head: returns acknowledged (freed)                      */
bit  R_sq; bit R_k; bit R_b; byte R_v; bit R_inc;     /* seq, key, ref, incarnation label       */

/* ---- reader-local state ------------------------------------------------------------------- */
byte ph[NR];
bit  le[NR]; byte lg[NR]; bit lb[NR]; byte lv[NR];    /* the lease: entry, gen, ref           */
byte HC[NR];                                          /* label of the newest credited beat    */
byte la[NR];                                          /* age of the lease's clock sample      */
byte ln[NR];                                          /* age of Renew's new sample            */
#ifdef KEEP_ENTRY_CACHE
bit  HE_p[NR*NE]; byte HE_gen[NR*NE]; bit HE_blk[NR*NE]; byte HE_ver[NR*NE];
#endif
#ifdef KEEP_BLOCK_CACHE
bit  HB_p[NR*NB]; byte HB_v[NR*NB];
#endif

/* ---- publisher-local state (lost in a crash) ---------------------------------------------- */
bit  pup = 1;                 /* running                                                        */
bit  pt;                      /* its ring_tail                                                  */
bit  phead;                   /* returns collected                                              */
bit  phand;                   /* returns handed to the caller (acknowledged at the next beat)   */
byte npub;                    /* PUBLISH requests posted (a bound)                              */
byte pcr;                     /* crashes so far (a bound)                                       */
#ifdef DUP_REQUEST
bit  dupsent;
#endif

/* ---- the arena of host 0 (persistent: survives a publisher crash) ------------------------- */
bit  pown[NB];                /* free in the publisher's allocator                             */
byte bwr[NB];                 /* the block's generation = version of the data it holds         */

/* ---- owner-local state (lost in a crash) --------------------------------------------------- */
bit  graced[NE];              /* retired at least one Step ago                                 */
byte dueE = NE;               /* Reclaim: scanned, no lease: to free (one: the ring has 1 slot) */
byte fh; byte ri; byte rb; byte dec;   /* FenceExpiredHosts' read, pending until its write     */
bit  seen[NR];                /* the owner's remembered stamp of reader r's lease row is the   */
                              /* row in memory (every write of the row changes its stamp)      */
byte oc[NR];                  /* age of changed_at: the owner's time it first saw that stamp   */
byte os;                      /* BUG_SAMPLE_BEFORE_READ: age of the scan's early clock sample  */
bit  osact;                   /* ... taken, its reads not done yet                             */
bit  rtp;                     /* a return slot written, return_tail not yet in the owner line  */
byte ocr;                     /* owner crashes so far (a bound)                                */

/* ---- predicates ---------------------------------------------------------------------------- */
#define ALIVE(r)    (HC[r] > 0)                       /* now <= alive_until_ms_               */
#define LEASE_OK(r) (la[r] <= HOST_LAST && ALIVE(r))  /* now <= lease.deadline_ms             */
#define RELIES(r)   (ph[r] >= HELD && ph[r] <= COPYING && LEASE_OK(r))
#define HOSTLIVE(h) (M_inc[h] > OL_fen[h])            /* PrefixOwner::HostLive                */
#define NAMED(b, v) ((LIVEG(O_gen[0]) && O_blk[0] == (b) && O_ver[0] == (v)) || \
                     (LIVEG(O_gen[1]) && O_blk[1] == (b) && O_ver[1] == (v)))
#define ROOM        (OL_rt == P_ack)                  /* ReturnRoom(0) > 0 (one slot)         */

/* ---- cache primitives ---------------------------------------------------------------------- */
inline flush_entry(e) {
  if :: O_edirty[e] -> M_gen[e] = O_gen[e]; M_blk[e] = O_blk[e]; M_ver[e] = O_ver[e];
                       O_edirty[e] = 0
     :: else -> skip fi
}
inline flush_host_row(r) {
  if :: C_hdirty[r] -> M_inc[r] = C_inc[r]; M_hb[r] = C_hb[r]; C_hdirty[r] = 0
     :: else -> skip fi
}
/* a new stamp reaches memory: the owner's remembered one no longer matches */
inline flush_lease_row(r) {
  if :: C_ldirty[r] -> M_lh[r] = C_lh[r]; M_le[r] = C_le[r]; M_lg[r] = C_lg[r];
                       M_li[r] = C_li[r]; C_ldirty[r] = 0; seen[r] = 0; oc[r] = 0
     :: else -> skip fi
}
/* PrefixHost::StoreLeaseRow: store (into the cache), Flush; the mfence that orders it before
   the next load is the one that load starts with (ReadEntryAndClock) */
inline write_lease_row(r, held, e, g) {
  C_lh[r] = held; C_le[r] = e; C_lg[r] = g; C_li[r] = C_inc[r]; C_ldirty[r] = 1;
  flush_lease_row(r)
}

/* reader r reads entry k into (g, b, v); read_entry_inv: Invalidate, then load */
#ifdef KEEP_ENTRY_CACHE
inline read_entry_inv(r, k, g, b, v) {
  HE_p[r*NE+k] = 1; HE_gen[r*NE+k] = M_gen[k]; HE_blk[r*NE+k] = M_blk[k];
  HE_ver[r*NE+k] = M_ver[k];
  g = HE_gen[r*NE+k]; b = HE_blk[r*NE+k]; v = HE_ver[r*NE+k]
}
inline read_entry_cached(r, k, g, b, v) {  /* a load with no Invalidate: may hit a stale copy */
  if :: !HE_p[r*NE+k] -> HE_p[r*NE+k] = 1; HE_gen[r*NE+k] = M_gen[k]; HE_blk[r*NE+k] = M_blk[k];
                         HE_ver[r*NE+k] = M_ver[k]
     :: else -> skip fi;
  g = HE_gen[r*NE+k]; b = HE_blk[r*NE+k]; v = HE_ver[r*NE+k]
}
#else
inline read_entry_inv(r, k, g, b, v) { g = M_gen[k]; b = M_blk[k]; v = M_ver[k] }
#endif
#ifdef BUG_STALE_REVALIDATE
#define read_entry_reval(r, k, g, b, v) read_entry_cached(r, k, g, b, v)
#else
#define read_entry_reval(r, k, g, b, v) read_entry_inv(r, k, g, b, v)
#endif

/* reader r reads block b's data: the generation (version) of the data it gets */
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
 * is in the future iff HC = 1), in its owner line (OL_ah) and in the owner's pending read
 * (rb). Time passing turns every 1 into 0 at once (hb_tick); a lease held then is past its
 * deadline for good (Deadline() caps it at alive_until_ms_ when it is taken or renewed). A
 * beat sent while the previous one is still fresh gets the same label (docs/model.md). */
inline hb_tick(r) {
  C_hb[r] = 0; HC[r] = 0;
  /* a lease's deadline is capped by alive_until when it is taken or renewed: it has passed */
  if :: ph[r] >= ACQ && ph[r] <= COPYING -> la[r] = HOST_CAP :: else -> skip fi;
  if :: M_inc[r] == C_inc[r] -> M_hb[r] = 0 :: else -> skip fi;
  if :: OL_ai[r] == C_inc[r] -> OL_ah[r] = 0 :: else -> skip fi;
  if :: fh == r && dec != D_NONE && ri == C_inc[r] -> rb = 0 :: else -> skip fi
}

/* ---- incarnation labels ---------------------------------------------------------------------
 * Incarnations are compared only with each other (fenced_incarnation, acked_incarnation, the
 * lease rows' and the owner's pending read's), and a new one is above all earlier ones. So
 * they are named by labels too: 1 = reader r's current incarnation, 0 = any earlier one (or
 * none). A Rejoin renames every 1 of r into 0, then takes 1 itself; hosts may rejoin and
 * restart any number of times. */
inline inc_new(r) {
  OL_fen[r] = 0;                                      /* fenced: an older incarnation      */
  OL_ai[r] = 0; OL_ah[r] = 0;                         /* acknowledged: an older one        */
  if :: fh == r && dec != D_NONE -> ri = 0; rb = 0 :: else -> skip fi;
  M_li[r] = 0; C_li[r] = 0;                           /* rows of an older incarnation       */
  C_inc[r] = 1; M_inc[r] = 0                          /* the new one (not in memory yet)    */
}

/* ---- reader helpers ------------------------------------------------------------------------ */
inline forget_lease(r) { ph[r] = IDLE; le[r] = 0; lg[r] = 0; lb[r] = 0; lv[r] = 0; la[r] = 0; ln[r] = 0 }
inline release_row(r) {          /* PrefixHost::Release: held = 0, Flush, Fence */
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
  byte g, tmp, v; bit b, k;
end_loop:
  do
  /* ---- Lookup(ns, key): Invalidate + read entry k; PUBLISHED is a hit. Takes no lease. */
  :: atomic { ph[r] == IDLE ->
       if :: k = 0 :: k = 1 fi;
       read_entry_inv(r, k, g, b, v);
       if :: PUB(g) -> le[r] = k; lg[r] = g; lb[r] = b; lv[r] = v; ph[r] = LOOKED
          :: else -> skip fi;
       g = 0; b = 0; k = 0; v = 0 }

  /* ---- Acquire(hit), first half: alive (an acknowledged heartbeat), now sampled, then the
   *      lease row {held, entry, gen, incarnation, seq} stored, Flush, FullFence. */
  :: atomic { ph[r] == LOOKED && ALIVE(r) ->
       la[r] = 0;
       C_lh[r] = 1; C_le[r] = le[r]; C_lg[r] = lg[r]; C_li[r] = C_inc[r];
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
       read_entry_reval(r, le[r], g, b, v);
#endif
       if :: g == lg[r] -> ph[r] = HELD
          :: else -> release_row(r)                         /* kNotFound; the row cleared */
       fi;
       g = 0; b = 0; v = 0 }

  /* ---- using the data under a valid lease (a zero-copy use, or the start of a copy): the
   *      lease must protect it. S1: the block is not free in its publisher's allocator, and
   *      holds the data of the ref the entry named (not rewritten since). */
  :: atomic { ph[r] == HELD && LEASE_OK(r) ->
       read_block(r, lb[r], tmp);
       assert(!pown[lb[r]] && bwr[lb[r]] == lv[r]);
       assert(tmp == lv[r]);
       tmp = 0;
       ph[r] = COPYING }
  /* ---- the copy ends (late, maybe: a pause, the deadline passed, the block reclaimed and
   *      rewritten meanwhile), then ValidateAfterCopy: the deadline on the local clock, then
   *      Invalidate + re-read the entry. S2: a copy that passes both holds the right data. */
  :: atomic { ph[r] == COPYING ->
       read_block(r, lb[r], tmp);
#ifdef BUG_NO_VALIDATE_AFTER_COPY
       assert(tmp == lv[r]);
#else
       if
       :: LEASE_OK(r) || NO_DEADLINE_CHECK ->
            read_entry_inv(r, le[r], g, b, v);
            if :: g == lg[r] || NO_GEN_CHECK -> assert(tmp == lv[r])
               :: else -> skip                                      /* kAborted: discarded */
            fi
       :: else -> skip                                     /* kDeadlineExceeded: discarded */
       fi;
#endif
       tmp = 0; g = 0; b = 0; v = 0;
       ph[r] = HELD }

  /* ---- Renew(lease): now sampled (ln), the lease still valid ... */
  :: atomic { ph[r] == HELD && LEASE_OK(r) -> ln[r] = 0; ph[r] = RENEW }
  /* ... then the row written again (lease_seq + 1), Flush, FullFence; the new deadline counts
   * from the sample. The fixed Renew looks at the clock again after the write: if the old
   * deadline has passed by then, the owner may have judged the old row expired and reclaimed
   * the block while this write was on its way, so the lease is lost.
   * BUG_RENEW_NO_SECOND_LOOK: Renew without the second look, as prefix_host.cc had it until
   * SPIN found the reclaim (tests/prefix_test.cc, RenewThatStalledPastItsDeadline...). */
  :: atomic { ph[r] == RENEW ->
       C_ldirty[r] = 1; flush_lease_row(r);
#ifdef BUG_RENEW_NO_SECOND_LOOK
       if :: true ->
#else
       if :: la[r] <= HOST_LAST && ALIVE(r) ->
#endif
             la[r] = ln[r]; ln[r] = 0; ph[r] = HELD
          :: else -> release_row(r)                                  /* kDeadlineExceeded */
       fi }

  /* ---- Release(lease) */
  :: atomic { ph[r] == HELD -> release_row(r) }

  /* ---- Heartbeat(): Invalidate + read the owner line: fenced => Rejoin; else credit the
   *      acknowledged beat (alive_until = its send time + host_ttl - margin); then a new beat
   *      in the host row (send time taken before the store), Flush, Fence. */
  :: atomic { ph[r] < DOWN ->
       if
       :: OL_fen[r] >= C_inc[r] -> rejoin(r)
       :: else ->
            if :: OL_ai[r] == C_inc[r] && OL_ah[r] > HC[r] -> HC[r] = OL_ah[r]
               :: else -> skip fi;
            C_hb[r] = 1; C_hdirty[r] = 1; flush_host_row(r);
#ifdef BUG_UNACKED_HEARTBEAT
            HC[r] = 1;                /* the host counts its own beat, acknowledged or not */
#endif
            skip
       fi }

  /* ---- heartbeat time passes on host r's clock: its beats' deadlines arrive */
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
       C_ldirty[r] = 0;
#ifdef KEEP_ENTRY_CACHE
       HE_p[r*NE] = 0; HE_gen[r*NE] = 0; HE_blk[r*NE] = 0; HE_ver[r*NE] = 0;
       HE_p[r*NE+1] = 0; HE_gen[r*NE+1] = 0; HE_blk[r*NE+1] = 0; HE_ver[r*NE+1] = 0;
#endif
#ifdef KEEP_BLOCK_CACHE
       HB_p[r*NB] = 0; HB_v[r*NB] = 0; HB_p[r*NB+1] = 0; HB_v[r*NB+1] = 0;
#endif
       hb_tick(r) }
  /* ---- restart: Join again, with a new incarnation */
  :: atomic { ph[r] == DOWN -> rejoin(r) }
  od
}

/* =============================================================================================
 * The publisher (host 0)
 * ============================================================================================= */
/* a crash: local state is lost; the arena (pown, bwr) and shared lines stay */
#define PCRASHPT \
  if :: pcr < MAXPCRASH -> pcr++; pup = 0; pt = 0; phead = 0; phand = 0 :: true -> skip fi

active proctype Publisher() {
  bit b, k;
end_loop:
  do
  /* Publish: the ring has room (Invalidate + read the owner line: ring_head == ring_tail; a
   * ring of one slot); a block it holds is written (streaming stores + Fence: in memory at
   * once, and the block's generation moves on) and PUBLISH(key k, ref) stored in the request
   * slot (seq = ring_tail + 1), Flush, Fence -- a crash may stop it here -- then ring_tail
   * advanced in the host row, Flush, Fence. */
  :: atomic { pup && pt == OL_head && npub < MAXPUB && (pown[0] || pown[1]) ->
       if
       :: npub == 0 -> b = 0; k = 0     /* blocks and entries are symmetric: the first */
       :: else ->                       /* publish names block 0 and key 0             */
            if :: pown[0] -> b = 0
               :: pown[1] -> b = 1 fi;
            if :: k = 0 :: k = 1 fi
       fi;
       pown[b] = 0; bwr[b]++; npub++;
       R_sq = !pt; R_k = k; R_b = b; R_v = bwr[b]; R_inc = 1;
       PCRASHPT;
       if :: pup -> pt = !pt; P_tail = pt; PCRASHPT :: else -> skip fi;
       b = 0; k = 0 }
#ifdef DUP_REQUEST
  /* once: a PUBLISH of a ref that is already published (a replayed or forged request) */
  :: atomic { pup && pt == OL_head && !dupsent && (PUB(M_gen[0]) || PUB(M_gen[1])) ->
       if :: PUB(M_gen[0]) -> R_b = M_blk[0]; R_v = M_ver[0]
          :: PUB(M_gen[1]) -> R_b = M_blk[1]; R_v = M_ver[1] fi;
       if :: R_k = 0 :: R_k = 1 fi;
       R_sq = !pt; R_inc = 1; pt = !pt; P_tail = pt; dupsent = 1 }
#endif
  /* Heartbeat: the row acknowledges what the previous call handed out (return_head); the
   * owner line is read and a new return collected (its slot's seq must be head + 1); the
   * caller frees it: the allocator frees a ref only while the block is allocated with that
   * generation (a second delivery, or a stale one, is ignored). */
  :: atomic { pup && (phead != OL_rt || P_ack != phand) ->
       P_ack = phand;
       if
       :: phead != OL_rt && RS_sq != phead ->
            phead = !phead;
#ifdef BUG_NO_GEN_FREE
            pown[RS_b] = 1
#else
            if :: !pown[RS_b] && bwr[RS_b] == RS_v -> pown[RS_b] = 1 :: else -> skip fi
#endif
       :: else -> skip
       fi;
       phand = phead;
       PCRASHPT }
  /* Rejoin after a crash (PrefixHost::Join): a new incarnation above the row's; ring_tail
   * from the row, and a request slot written but never announced (seq = ring_tail + 1, an
   * older incarnation) is announced now, so that the owner returns its block; returns are
   * collected again from the acknowledged return_head (at-least-once). */
  :: atomic { !pup ->
       R_inc = 0;                                         /* older incarnations: label 0 */
       pt = P_tail;
       if :: R_sq != P_tail && P_tail == OL_head -> pt = !pt :: else -> skip fi;
       phead = P_ack; phand = P_ack;
       P_inc = 1; P_tail = pt;                            /* the host row, Flush, Fence  */
       pup = 1 }
  od
}

/* =============================================================================================
 * The owner: PrefixOwner::Step in a loop
 * ============================================================================================= */
/* the owner crashes right after a shared store: everything it kept in its own memory is
 * lost; its stores are in memory already (each one was flushed) or, where a bug variant
 * skipped a flush, in its machine's cache, which the new owner reads through (a restart on
 * the same machine) and which the Evictor writes back in time */
inline owner_crash() {
  ocr++;
  graced[0] = 0; graced[1] = 0; dueE = NE;
  fh = 0; ri = 0; rb = 0; dec = D_NONE;
  seen[0] = 0; seen[1] = 0; oc[0] = 0; oc[1] = 0; os = 0; osact = 0; rtp = 0;
  e = 0; b = 0; v = 0; c0 = 0; c1 = 0; l0 = 0; l1 = 0; torn = 0
}
#define OCRASHPT if :: ocr < MAXOCRASH -> owner_crash(); goto down :: true -> skip fi

/* ReturnBlock: the return slot (seq = return_tail + 1) written, Flush, Fence; return_tail
 * moves on in owner memory, and reaches the owner line at its next write */
inline return_block(xb, xv) { RS_sq = !OL_rt; RS_b = xb; RS_v = xv; rtp = 1 }
/* WriteOwnerLine(0): ring_head and return_tail, Flush, Fence */
#define WRITE_LINE0 if :: rtp -> OL_rt = !OL_rt; rtp = 0 :: else -> skip fi

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
#define FENCE_WRITE(h) \
  if \
  :: dec == D_FENCE -> OL_fen[h] = ri; fh = 0; ri = 0; rb = 0; dec = D_NONE; OCRASHPT \
  :: dec == D_ACK && (OL_ai[h] != ri || OL_ah[h] != rb) -> \
       OL_ai[h] = ri; OL_ah[h] = rb; fh = 0; ri = 0; rb = 0; dec = D_NONE; OCRASHPT \
  :: else -> fh = 0; ri = 0; rb = 0; dec = D_NONE \
  fi

/* ScanLeases for reader h (rows naming entry e at generation g): HostLive (Invalidate + read
 * the host row, which may be torn: unreadable), then Invalidate + read the lease row; a new
 * stamp gets changed_at = the owner's clock sample (after the read in the fixed code; the
 * early sample under BUG_SAMPLE_BEFORE_READ); a live row of the current incarnation naming
 * (e, g) and not expired (now - changed_at <= ttl) keeps the block. */
#ifdef BUG_SAMPLE_BEFORE_READ
#define SAMPLE os
#else
#define SAMPLE 0
#endif
#ifdef BUG_SCAN_ALL_ROWS
#define ROW_KEEPS(h, e) (M_lh[h] && M_le[h] == e && M_lg[h] + 1 == O_gen[e])
#else
#define ROW_KEEPS(h, e) (M_lh[h] && M_li[h] == M_inc[h] && M_le[h] == e && \
                         M_lg[h] + 1 == O_gen[e] && oc[h] < OWNER_EXP + SAMPLE)
#endif
inline scan_host(h) {
  if
#ifndef LIVENESS
  :: h == 0 -> torn = 1       /* host 1's row is unreadable (torn); host 2 is its mirror */
#endif
  :: HOSTLIVE(h) ->
       if :: !seen[h] && M_lh[h] -> seen[h] = 1; oc[h] = SAMPLE
          :: !seen[h] && !M_lh[h] -> seen[h] = 1     /* a row not held: its age is moot */
          :: else -> skip fi;
       if :: ROW_KEEPS(h, 0) -> l0 = 1 :: else -> skip fi;
       if :: ROW_KEEPS(h, 1) -> l1 = 1 :: else -> skip fi
  :: !HOSTLIVE(h) ->
#ifdef BUG_SCAN_ALL_ROWS
       if :: ROW_KEEPS(h, 0) -> l0 = 1 :: else -> skip fi;   /* fenced hosts' rows too */
       if :: ROW_KEEPS(h, 1) -> l1 = 1 :: else -> skip fi
#else
       skip
#endif
  fi
}

active proctype Owner() {
  byte e, v;
  bit b, c0, c1, l0, l1, torn;
end_loop:
  do
  :: atomic {
       FENCE_WRITE(1);

       /* grace: an entry retired in an earlier Step is past grace now */
       graced[0] = RET(O_gen[0]); graced[1] = RET(O_gen[1]);

       /* ApplyRequests, host 0: Invalidate + read its row (ring_tail, incarnation,
        * return_head); a request is consumed only while the return ring has room; Invalidate
        * + read the slot (seq = ring_head + 1, else next round) */
       if
       :: P_tail != OL_head && ROOM && R_sq != OL_head ->
            e = R_k; b = R_b; v = R_v;
            if
            :: R_inc == P_inc ->                            /* Apply */
                 if
#ifndef BUG_DUP_REF
                 :: NAMED(b, v) -> skip                     /* a ref named twice: rejected */
#endif
                 :: else ->
                      if
                      :: LIVEG(O_gen[e]) -> return_block(b, v)   /* key present / no slot */
                      :: else ->                                 /* PUBLISHED(gen + 1)    */
                           O_gen[e] = O_gen[e] + 1; O_blk[e] = b; O_ver[e] = v;
                           O_edirty[e] = 1; flush_entry(e)
                      fi
                 fi
            :: else ->          /* a late request of an older incarnation: not applied */
#ifdef BUG_STALE_RETURN
                 return_block(b, v)             /* its block goes back, named or not   */
#else
                 if :: NAMED(b, v) -> skip      /* the index names it: it is not ours  */
                    :: else -> return_block(b, v) fi
#endif
            fi;
            OCRASHPT;                           /* entry (or return slot) in memory    */
            OL_head = !OL_head; WRITE_LINE0;    /* the owner line: ring_head           */
            OCRASHPT;
            e = 0; b = 0; v = 0
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
            OCRASHPT
       :: else -> skip
       fi;
       e = 0;
#ifdef BUG_SAMPLE_BEFORE_READ
       /* ScanLeases samples the clock before it reads any row */
       if :: (RET(O_gen[0]) && graced[0]) || (RET(O_gen[1]) && graced[1]) -> os = 0; osact = 1
          :: else -> skip fi;
#endif
       skip }

     /* Reclaim: if host 0's return ring has room (its row read), one scan of the live
      * hosts' lease rows; the first entry past grace that no live, unexpired lease names is
      * due (the ring has one slot). An unreadable host row frees nothing this round
      * (BUG_TORN_ROW_SKIPPED: that host is skipped, as HostLive's false made ScanLeases do).
      * BUG_ROOM_BEFORE_SCAN: the slot is promised to the first entry past grace before the
      * scan, as prefix_owner.cc's Reclaim once did (room counted down per due entry before
      * ScanLeases): a leased retired entry then holds back every other one of its
      * publisher (tests/prefix_test.cc: LongLeasesDoNotStarveThePublishersOtherReturns).
      * Then FenceExpiredHosts reads reader 0's host row. */
     atomic {
#ifdef BUG_NO_GRACE
       c0 = RET(O_gen[0]); c1 = RET(O_gen[1]);        /* informational: no grace wait */
#else
       c0 = RET(O_gen[0]) && graced[0]; c1 = RET(O_gen[1]) && graced[1];
#endif
#ifdef BUG_ROOM_BEFORE_SCAN
       if :: c0 -> c1 = 0 :: else -> skip fi;  /* the ring's one slot reserved for the first */
#endif
       if
       :: (c0 || c1) && ROOM ->
            scan_host(0);
            scan_host(1);
#ifdef BUG_TORN_ROW_SKIPPED
            torn = 0;                           /* the torn host's rows were skipped */
#endif
            if
            :: torn -> skip                     /* an unreadable host row: free nothing */
            :: !torn && c0 && !l0 -> dueE = 0
            :: !torn && !(c0 && !l0) && c1 && !l1 -> dueE = 1
            :: else -> skip
            fi
       :: else -> skip
       fi;
       c0 = 0; c1 = 0; l0 = 0; l1 = 0; torn = 0; os = 0; osact = 0;
       fence_read(0) }

     /* ... the hosts act, then the due entry is freed: its ref into the return slot, the
      * owner line (return_tail), then the entry becomes TOMBSTONE(gen + 1), each stored,
      * flushed, fenced. Then reader 0's owner line, and reader 1's host row read. */
     atomic {
       if
       :: dueE < NE ->
            e = dueE;
            /* S3: never freed while a host holds a valid lease on it */
            assert(!(RELIES(0) && le[0] == e && lg[0] + 1 == O_gen[e]));
            assert(!(RELIES(1) && le[1] == e && lg[1] + 1 == O_gen[e]));
            return_block(O_blk[e], O_ver[e]);
            OCRASHPT;
            WRITE_LINE0;
            OCRASHPT;
            O_gen[e] = O_gen[e] + 1; O_edirty[e] = 1; flush_entry(e);
            dueE = NE; e = 0;
            OCRASHPT
       :: else -> skip
       fi;
       FENCE_WRITE(0);
       fence_read(1) }
  od;
down:
  /* PrefixOwner::Open: the index and the owner lines are read back (the new owner's state
   * is theirs and nothing else: owner_crash cleared the rest); timers start now (a row's
   * first read stamps it with the new owner's clock), grace counts from the first Step */
  atomic { skip };
  goto end_loop
}

/* =============================================================================================
 * The lease clock: one tick ages every lease-time stamp that is still counting
 * ============================================================================================= */
#define AGES(r) ((ph[r] >= ACQ && ph[r] <= COPYING && la[r] < HOST_CAP) || \
                 (ph[r] == RENEW && ln[r] < HOST_CAP) || (seen[r] && M_lh[r] && oc[r] < OWNER_EXP))
inline age(r) {
  if :: ph[r] >= ACQ && ph[r] <= COPYING && la[r] < HOST_CAP -> la[r]++ :: else -> skip fi;
  if :: ph[r] == RENEW && ln[r] < HOST_CAP -> ln[r]++ :: else -> skip fi;
  if :: seen[r] && M_lh[r] && oc[r] < OWNER_EXP -> oc[r]++ :: else -> skip fi
}
active proctype Clock() {
end_loop:
  do
  :: atomic { AGES(0) || AGES(1) || (osact && os < OWNER_EXP) ->
       age(0); age(1);
       if :: osact && os < OWNER_EXP -> os++ :: else -> skip fi }
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
  :: atomic { HE_p[0] -> HE_p[0] = 0; HE_gen[0] = 0; HE_blk[0] = 0; HE_ver[0] = 0 }
  :: atomic { HE_p[1] -> HE_p[1] = 0; HE_gen[1] = 0; HE_blk[1] = 0; HE_ver[1] = 0 }
  :: atomic { HE_p[2] -> HE_p[2] = 0; HE_gen[2] = 0; HE_blk[2] = 0; HE_ver[2] = 0 }
  :: atomic { HE_p[3] -> HE_p[3] = 0; HE_gen[3] = 0; HE_blk[3] = 0; HE_ver[3] = 0 }
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
 * S4, index invariants: no ref is named by two live entries, and a PUBLISHED entry's block is
 * allocated in its publisher's arena and holds the data of that ref (else it could be handed
 * out twice, or rewritten under its readers)
 * ============================================================================================= */
#define INV_ONE_NAME  (!(LIVEG(O_gen[0]) && LIVEG(O_gen[1]) && O_blk[0] == O_blk[1] && \
                         O_ver[0] == O_ver[1]))
#define PUB_INTACT(e) (!PUB(O_gen[e]) || (!pown[O_blk[e]] && bwr[O_blk[e]] == O_ver[e]))
#define INV_INTACT    (PUB_INTACT(0) && PUB_INTACT(1))
active proctype Monitor() {
  atomic { !(INV_ONE_NAME && INV_INTACT) -> assert(INV_ONE_NAME && INV_INTACT) }
}

init {
  byte i;
  atomic {
    for (i : 0 .. NR - 1) {
      C_inc[i] = 1; M_inc[i] = 1; C_hb[i] = 1; M_hb[i] = 1; C_li[i] = 1; M_li[i] = 1
    }
    P_inc = 1;
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
               [] ((ph[0] == DEAD && M_inc[0] > OL_fen[0]) -> <> (M_inc[0] <= OL_fen[0])) }
ltl fenced0  { [] ((ph[0] == DEAD && M_inc[0] > OL_fen[0]) -> <> (M_inc[0] <= OL_fen[0])) }
