"""What must hold after every step of a history.

Safety, from the audit's ledger (audit/check.py):
- the step's own commits: none the level promised is lost, none torn, no
  in-doubt commit whose pg_xact_status disagrees with its rows, no read
  of a commit that was then lost where the level promises reads;
- every earlier step's rows as they were when that step ended: nothing
  gone and nothing added.  Each step ends with the primary's WAL flushed
  and every node caught up, so whatever level its commits were
  acknowledged at, no later fault may take them (those the step's own
  fault was allowed to take are dropped from its ledger then); and a
  commit that was not there then (in doubt and lost, acknowledged at a
  level that did not promise it, rolled back, or a prepared transaction
  rolled back) must never come back: a later fault that resurrects it (a
  standby promoted with WAL the primary lost, a timeline not switched) is
  a broken promise too, though every node may agree on it.
Liveness (a verdict, not a lab error): every node that should serve
accepts connections, every standby streams from its upstream and has
replayed the primary's WAL, all within one deadline of START_S + CATCHUP_S
from the step's end (so waits that each keep within a bound cannot add up
to a cluster that takes far longer).  A former primary awaiting its rejoin
is the only node allowed to be down.
Convergence: every node then holds the same rows as the primary, every
standby receives the primary's timeline, and every history file of the
primary's lineage that a live node or the archive holds has the primary's
bytes (timelines are compared by content, not by number).
Archive: no name in the shared archive was offered with two different byte
strings (archive/conflicts is empty), no segment of an old timeline across
a crash switch is archived under its full name (unless the record the crash
cut had finished it: cluster._finished_by_the_cut_record), and every
archived segment that the primary holds complete is byte for byte the
primary's: the archive never holds WAL the primary lost.
Logs: no node logged a TRAP, a PANIC, a process killed by a signal or a
crash-restart cycle since the last step (logscan.py); the explorer's faults
cause none of them.
"""
from __future__ import annotations

import time

import psycopg

from ..audit import check
from ..audit.ledger import Load
from ..util import LabError, wait_for
from .cluster import HistoryCluster, lsn_int, wait_accepting
from .logscan import LogScanner

START_S = 120    # crash recovery of a few hundred MB of WAL on a loaded 2-core machine
CATCHUP_S = 60   # reconnect (retry interval 100 ms) and replay the step's WAL

# fault labels: check.FAULTS' names where a step is one of those, and two
# that check's promise table knows for the explorer
NONE = "none"                  # nothing crashed that a promise depends on: every commit stays
ASYNC_FAILOVER = "failover-async"  # a standby promoted that no commit waited for: nothing promised


class Failure(Exception):
    """A broken promise or a liveness failure; `kind` is its first word."""

    def __init__(self, message: str):
        super().__init__(message)
        self.kind = message.split(":", 1)[0]


def check_ledgers(hc: HistoryCluster, ledgers: list[tuple[Load, str]], label: str) -> dict:
    """The newest ledger (this step's) with its level's promise, then every
    earlier one in full, on the primary.  Raises Failure."""
    load, level = ledgers[-1]
    with hc.primary.connect() as c:
        chk = check.check_node(c, load, hc.primary.name)
        bad = check.violations(level, label, chk)
        for old, _ in ledgers[:-1]:
            o = check.check_node(c, old, hc.primary.name, statuses=False)
            if o.acked_lost or o.torn:
                bad.append(f"{o.acked_lost} commits of step {old.cycle} (settled then) lost, {o.torn} torn "
                           f"({'; '.join(o.lost_examples + o.torn_examples)})")
            changed = settled_changes(old, *cycle_rows(c, old.cycle))
            if changed:
                bad.append(f"step {old.cycle}'s rows changed since it ended: {changed}")
        if not bad:
            _settle(c, load)
        # in-doubt prepared transactions were never acknowledged: rolled back
        c.execute("SET synchronous_commit = local")
        gids = [g for (g,) in c.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'audit\\_%'")]
        for g in gids:
            c.execute(f"ROLLBACK PREPARED '{g}'")
    if bad:
        raise Failure("safety: " + "; ".join(bad))
    return {"acked": chk.acked, "acked_lost": chk.acked_lost, "in_doubt": chk.in_doubt,
            "reads_lost": sum(chk.reads_lost.values()), "reads": chk.reads,
            "reads_lost_by": {k: v for k, v in chk.reads_lost.items() if v},
            "prepared_rolled_back": len(gids)}


def cycle_rows(conn, cycle: int) -> tuple[frozenset, int]:
    """A cycle's rows as (writer, seq, part) and its hot row's value (none
    where a fault took the tables themselves)."""
    try:
        rows = frozenset(conn.execute("SELECT writer, seq, part FROM audit_rows WHERE cycle = %s", (cycle,)))
        row = conn.execute("SELECT v FROM audit_hot WHERE cycle = %s", (cycle,)).fetchone()
    except psycopg.errors.UndefinedTable:
        return frozenset(), 0
    return rows, (row[0] if row else 0)


def settled_changes(load: Load, rows: frozenset, hot: int) -> str | None:
    """How a cycle's rows differ from what they were when its step ended
    (None: not at all).  Rows that came back are named first: a commit
    the step's fault took, or one that never committed, reappearing."""
    if load.settled is None:
        return None
    was_rows, was_hot = load.settled
    back = sorted(rows - was_rows)
    gone = sorted(was_rows - rows)
    out = []
    if back or hot > was_hot:
        what = [f"writer {w} seq {s} part {p}" for w, s, p in back[:3]]
        if hot > was_hot:
            what.append(f"hot row {was_hot} -> {hot}")
        out.append(f"resurrected {len(back)} rows{' and hot increments' if hot > was_hot else ''} "
                   f"that were not there then ({'; '.join(what)})")
    if gone or hot < was_hot:
        what = [f"writer {w} seq {s} part {p}" for w, s, p in gone[:3]]
        if hot < was_hot:
            what.append(f"hot row {was_hot} -> {hot}")
        out.append(f"{len(gone)} rows{' and hot increments' if hot < was_hot else ''} gone that were there "
                   f"({'; '.join(what)})")
    return "; ".join(out) or None


def _settle(conn, load: Load) -> None:
    """Keep in the step's ledger only the commits that are there now: those
    the step's fault was allowed to take (its level did not promise them)
    are not asked of later steps.  What is there now is recorded whole, so
    that later steps can tell a row gone from a row come back."""
    rows, hot = cycle_rows(conn, load.cycle)
    parts = {(w, s) for w, s, _ in rows}
    for w in load.writers:
        w.acked = [c for c in w.acked if (c.seq <= hot if w.kind == "hot" else (w.writer, c.seq) in parts)]
    load.readers = []  # reads are judged once, against the step's own fault
    load.settled = (rows, hot)


def _streaming(upstream, name: str) -> bool:
    try:
        return bool(upstream.scalar("SELECT count(*) FROM pg_stat_replication WHERE application_name = %s "
                                    "AND state = 'streaming'", (name,)))
    except psycopg.Error:
        return False


def check_liveness(hc: HistoryCluster) -> dict:
    """Every live node up, streaming and caught up within one deadline;
    returns seconds taken."""
    t0 = time.monotonic()
    deadline = t0 + START_S + CATCHUP_S

    def left(bound: float) -> float:
        # each wait keeps its own bound, and none runs past the deadline
        return max(1.0, min(bound, deadline - time.monotonic()))

    for n in hc.live():
        try:
            wait_accepting(n, left(START_S - (time.monotonic() - t0)))
        except LabError:
            raise Failure(f"liveness: {n.name} did not accept connections within {START_S} s") from None
    for n in hc.standbys():
        try:
            wait_for(lambda: _streaming(n.upstream, n.name), left(CATCHUP_S), f"{n.name} streaming")
        except LabError:
            raise Failure(f"liveness: {n.name} does not stream from {n.upstream.name} "
                          f"({time.monotonic() - t0:.0f} s after the step)") from None
    with hc.primary.connect() as c:
        c.execute("SET synchronous_commit = local")
        c.execute("SELECT txid_current()")  # a flushed commit to end on
        target = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    for n in hc.standbys():
        try:
            wait_for(lambda: (hc.replayed(n) or 0) >= lsn_int(target), left(CATCHUP_S), f"{n.name} replay")
        except LabError:
            raise Failure(f"liveness: {n.name} did not replay to {target} within "
                          f"{time.monotonic() - t0:.0f} s of the step's end "
                          f"(at {n.scalar('SELECT pg_last_wal_replay_lsn()::text')})") from None
    return {"catch_up_s": round(time.monotonic() - t0, 3)}


DIGEST = ("SELECT (SELECT count(*) FROM audit_rows), "
          "(SELECT md5(coalesce(string_agg(concat_ws(',', cycle, writer, seq, part), ';' "
          "ORDER BY cycle, writer, seq, part), '')) FROM audit_rows), "
          "(SELECT coalesce(string_agg(concat_ws(',', cycle, v), ';' ORDER BY cycle), '') FROM audit_hot)")


def check_convergence(hc: HistoryCluster) -> dict:
    want = hc.primary.sql(DIGEST)[0]
    tli = hc.timeline()
    for n in hc.standbys():
        got = n.sql(DIGEST)[0]
        if got != want:
            raise Failure(f"diverged: {n.name} holds {got[0]} rows (digest {got[1][:8]}), the primary "
                          f"{want[0]} ({want[1][:8]}), after catching up")
        rtli = n.scalar("SELECT received_tli FROM pg_stat_wal_receiver")
        if rtli != tli:
            raise Failure(f"timeline: {n.name} receives timeline {rtli}, the primary is on {tli}")
    mismatched = hc.history_mismatches()
    if mismatched:
        raise Failure(f"timeline: history files differ: {'; '.join(mismatched[:3])}")
    across = hc.archive_switch_segments()
    if across:
        raise Failure(f"archive: an old timeline's segment across a crash switch archived under its full "
                      f"name: {'; '.join(across[:3])}")
    conflicts = hc.archive_conflicts()
    if conflicts:
        raise Failure(f"archive: the same name archived with other bytes: {', '.join(conflicts[:5])}")
    compared, differ = hc.archive_against_primary()
    if differ:
        raise Failure(f"archive: segments differ from the primary's copy (WAL the primary lost): "
                      f"{', '.join(differ[:5])}")
    return {"rows": want[0], "timeline": tli, "archived": hc.archived(), "archive_compared": compared}


def check_logs(hc: HistoryCluster, scanner: LogScanner) -> dict:
    """What every node logged since the last scan (down nodes too: a node
    that failed to come back may say why).  Raises Failure on a line the
    explorer's faults never cause; returns the replication errors counted."""
    findings, repl = scanner.scan(hc.c.nodes.values())
    if findings:
        raise Failure("log: " + "; ".join(str(f) for f in findings[:3])
                      + (f" (and {len(findings) - 3} more)" if len(findings) > 3 else ""))
    return {"replication_errors": repl}
