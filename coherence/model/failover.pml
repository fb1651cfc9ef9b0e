/*
 * failover.pml -- Promela model of a leader change of orchestrator HA (docs/ha.md, "The
 * fence") with a zombie leader, on memory that is NOT coherent between machines. It checks
 * the one thing the fence must give the prefix protocol (prefix.pml models that protocol
 * with a single owner): once the successor stores to the domain, no store of the old term
 * reaches memory, so the successor's decisions hold. docs/model.md, "Leader change with a
 * zombie leader", maps each step to the code.
 *
 * Processes
 *   OldLeader   leader A (epoch 1) on machine A: one owner batch applies a pending
 *               PUBLISH(K, blk): a gate check, then the entry store (into machine A's cache:
 *               dirty), then its clwb (to memory). It may be killed (kill -9) at any point,
 *               and it may stand still (SIGSTOP, a VM stop) at any point: interleaving. Its
 *               keep-alive learns that the lease is gone; it then steps down: the release
 *   Agent       A's write-back agent (a process of machine A): once A is dead, writes
 *               machine A's cache back, then the release line
 *   Evictor     machine A's cache writes a dirty line back at any time, the takeover and
 *               long after it included
 *   Time        A's write deadline passes (its gate closes) and the session lease ends in
 *               etcd; with clocks that count a stop (BOOTTIME) the deadline passes before
 *               the lease ends (the margin); a VM stop freezes A's clock, so the lease may
 *               end while A's gate is still open (audit-ha #1)
 *   Successor   leader B (epoch 2) on machine B, elected once the lease ended: waits for the
 *               release of epoch 1, then claims the fence line, opens (reads the entry from
 *               memory), applies the same pending PUBLISH if the entry is empty, retires the
 *               entry and reclaims it: the block goes back to its publisher (freed), the
 *               entry becomes EMPTY with the next generation. B's stores are written back
 *               and fenced (WriteShared): one variable each
 *   Monitor     S1: memory never holds a PUBLISHED entry naming a block its publisher got
 *               back. S2: no store of epoch 1 reaches memory after B's first store
 *
 * Bug variants (check.sh expects SPIN to find a counterexample for each):
 *   BUG_NO_WRITEBACK    the release line without the domain written back first (HA before
 *                       issue #29: audit-ha #2): a dirty line of A lands after B's stores
 *   BUG_NO_RELEASE_WAIT B does not wait for the release; it starts once the lease ended
 *                       (a zombie with frozen clocks stores after B: audit-ha #1)
 */

#define EMPTY     0
#define PUBLISHED 1

/* an index entry: state, generation, the term whose owner wrote it */
byte m_state = EMPTY;   /* memory */
byte m_gen = 0;
byte m_term = 0;
bool a_dirty = false;   /* machine A's cache holds the entry dirty */
byte a_state;           /* ... its value */
byte a_gen;

bool gate_closed = false;   /* A's write deadline passed (A's own clock): the gate drops stores */
bool lease_ended = false;   /* etcd: the session lease of epoch 1 is gone; B may be elected */
bool vm_stop = false;       /* A's clock froze across a stop: the deadline can pass after the lease */
bool a_dead = false;        /* kill -9 (or its agent's SIGKILL) */
bool a_done = false;        /* A stepped down or died: it never stores again */
bool released = false;      /* the release line of epoch 1 is in memory */
bool b_stored = false;      /* B made its first store (the fence-line claim) */
bool freed = false;         /* B returned blk to its publisher */

/* A's machine writes its dirty entry back (clwb, an eviction, the agent's write-back) */
inline write_back_a() {
  atomic {
    if
    :: a_dirty ->
#ifndef NO_S2
       assert(!b_stored);   /* S2: a store of epoch 1 lands after the successor's first */
#endif
       m_state = a_state; m_gen = a_gen; m_term = 1; a_dirty = false
    :: else -> skip
    fi
  }
}

/* the release: the domain range written back from machine A, then the release line */
inline release() {
#ifndef BUG_NO_WRITEBACK
  write_back_a();
#endif
  released = true
}

proctype OldLeader() {
  /* one owner batch: applies PUBLISH(K, blk) into the entry it believes empty */
  if
  :: atomic { !a_dead && !gate_closed -> skip }   /* the fenced Mem's gate check passes */
     /* ... and the store: a process stands still between the check and the store only
        in the VM-stop case; otherwise the agent kills a process stopped past its deadline
        (docs/ha.md), so the store lands only while the gate is open */
     if
     :: atomic { !a_dead && (!gate_closed || vm_stop) ->
                 a_state = PUBLISHED; a_gen = 1; a_dirty = true }
     :: atomic { !a_dead && gate_closed && !vm_stop -> a_dead = true }  /* the agent's SIGKILL */
     :: atomic { a_dead -> skip }
     fi;
     if
     :: atomic { !a_dead -> write_back_a() }      /* its clwb */
     :: atomic { a_dead -> skip }
     fi
  :: atomic { a_dead || gate_closed -> skip }      /* dropped */
  fi;
  /* its keep-alive finds the lease gone (or it died): the term ends */
  if
  :: atomic { !a_dead && (lease_ended || gate_closed) -> a_done = true };
     release()                                     /* StepDown */
  :: atomic { a_dead -> a_done = true }
  fi
}

proctype Agent() {
end:
  atomic { a_dead -> skip };
  release()
}

proctype Killer() {
  if
  :: atomic { !a_done -> a_dead = true }
  :: true -> skip          /* never killed */
  fi
}

proctype Evictor() {
  do
  :: write_back_a()
  :: a_done && !a_dirty -> break
  od
}

proctype Time() {
  if
  :: vm_stop = true
  :: skip
  fi;
  if
  :: vm_stop -> lease_ended = true; gate_closed = true   /* the deadline after the lease */
  :: else -> gate_closed = true; lease_ended = true
  fi
}

proctype Successor() {
  atomic { lease_ended -> skip };                  /* elected at epoch 2 */
#ifndef BUG_NO_RELEASE_WAIT
  atomic { released -> skip };                     /* AwaitRelease */
#endif
  b_stored = true;                                 /* WriteFenceLine: the claim */
  atomic {                                         /* Open, then the pending PUBLISH */
    if
    :: m_state == EMPTY -> m_state = PUBLISHED; m_gen = m_gen + 1; m_term = 2
    :: else -> skip
    fi
  };
  atomic { m_state = EMPTY; m_gen = m_gen + 1; m_term = 2; freed = true }  /* retire, reclaim */
}

proctype Monitor() {
end:
  atomic { freed && m_state == PUBLISHED -> assert(false) }   /* S1 */
}

init {
  atomic {
    run OldLeader(); run Agent(); run Killer(); run Evictor(); run Time();
    run Successor(); run Monitor()
  }
}
