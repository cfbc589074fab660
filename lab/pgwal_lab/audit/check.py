"""A recovered node's tables against a cycle's ledger, and what each level
promises under each fault (server/README.md, "What each durability level
promises" and "What each read channel can see before the flush").

Counted per node:
  acked_lost       acknowledged commits whose rows (or hot-row increment)
                   are not there: 0 wherever the level promises survival
  torn             acknowledged or present transactions with a wrong set of
                   parts (a large transaction half there, a rolled-back
                   subtransaction's row there): 0 always
  reads_lost       reads that saw a commit that is not there (per reader
                   kind), with how far (commits) and how long before the
                   fault the newest such read was
  status_lied      in-doubt commits whose pg_xact_status after recovery
                   disagrees with their rows: 0 always
"""
from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from .ledger import EXPECTED_PARTS, HOT, Load

FAULTS = ("kill", "power", "standby-power", "failover", "failover-both", "partition", "held-power",
          "held-failover-both")

# faults that are one of the first five with something done before the crash
_AS = {"partition": "failover", "held-power": "power", "held-failover-both": "failover-both",
       # the history explorer's: the old primary frozen, not dead, at the
       # promotion, then fenced; what it acknowledged after it came back
       # is judged as a failover's
       "paused-failover": "failover",
       "one-way-failover": "failover",
       # the promoted standby loses power too, only later (while it promotes)
       "promote-power": "failover-both"}

FAULT_DOC = {
    "kill": "every primary process SIGKILLed at once; the primary restarts (crash recovery)",
    "power": "the primary's processes SIGKILLed and its unsynced writes dropped (emulated OS crash)",
    "standby-power": "power loss on the standby alone; it restarts and catches up, the primary serves on",
    "failover": "primary power loss, the standby (up) promoted",
    "failover-both": "power loss on primary and standby together; the standby restarts and is promoted",
    "partition": "the link cut (its connections reset) while the primary serves on, healed, the standby "
                 "reconnected; then a failover",
    "held-power": "chosen moment: the primary's WAL fsyncs held, so what it wrote stays unflushed (commits "
                  "released early are visible meanwhile), then its power lost",
    "held-failover-both": "chosen moment: the standby's WAL fsyncs held, so what it received or wrote stays "
                          "unflushed (a flush worker's walreceiver acknowledges receipt meanwhile), then "
                          "failover-both",
}


def base_fault(fault: str) -> str:
    """The crash a fault ends in: one of kill, power, standby-power, failover, failover-both."""
    return _AS.get(fault, fault)

# which levels promise that an acknowledged commit survives each fault
_SURVIVES = {
    "kill": {"local", "remote_receive", "remote_write", "on", "remote_apply"},
    "power": {"local", "remote_receive", "remote_write", "on", "remote_apply"},
    "standby-power": {"off", "local", "remote_receive", "remote_write", "on", "remote_apply"},
    "failover": {"remote_receive", "remote_write", "on", "remote_apply"},
    "failover-both": {"on", "remote_apply"},
    # the history explorer's labels (history/steps.py): a step that crashed
    # nothing a promise depends on, and a promotion of a standby no commit
    # waited for
    "none": {"off", "local", "remote_receive", "remote_write", "on", "remote_apply"},
    "failover-async": set(),
}


def base_level(level: str) -> str:
    """'local_non_durable_reads' and 'on+flush_worker' -> the synchronous_commit value."""
    name = level.split("+")[0]
    return "local" if name == "local_non_durable_reads" else name


def early_release(level: str) -> bool:
    return level.split("+")[0] == "local_non_durable_reads" or "+early_release" in level


def acks_promised(level: str, fault: str) -> bool:
    """The level promises that every acknowledged commit survives the fault."""
    return base_level(level) in _SURVIVES[base_fault(fault)]


def is_control(level: str, fault: str) -> bool:
    """A cell that must show losses, or the audit cannot see them: `off`
    wherever it promises nothing, `local` (with or without early release)
    under failover, where a stalled link leaves its commits on the primary
    alone; and a flush worker's walreceiver, which acknowledges receipt
    while its flush is held and both nodes then lose power
    (held-failover-both; without the worker the walreceiver waits in that
    fsync itself and acknowledges little or nothing meanwhile)."""
    if acks_promised(level, fault):
        return False
    base = base_level(level)
    if fault == "held-failover-both" and base in ("remote_receive", "remote_write") and "+flush_worker" in level:
        return True
    return base == "off" or (base == "local" and base_fault(fault).startswith("failover"))


# the readers that see an early-released commit before its flush
WINDOW_READERS = ("plain", "block", "for_update")


def window_expected(level: str, fault: str) -> bool:
    """A cell where the documented read window must show: with the
    primary's WAL flush held, a plain reader sees early-released commits
    that the power loss then takes (server/README.md, "What each read
    channel can see before the flush").  None seen means the chosen moment
    missed the window, as a control without losses would."""
    return fault == "held-power" and early_release(level)


def reads_promised(level: str, fault: str, reader: str) -> bool:
    """The level promises that a reader of this kind never sees a commit the
    fault then takes back.  Without early release a commit is visible only
    once it is as durable as its acknowledgement; with it, only a
    durable_snapshots reader and pg_xact_status wait, for the local flush.
    A reader on the synchronous standby (the history explorer's `standby`)
    sees only WAL the primary flushed and the standby flushed, at every
    level: what it saw survives anything but a failover to another standby."""
    if reader == "standby":
        return fault != "failover-async"
    if not acks_promised(level, fault):
        return False
    if base_fault(fault) == "none" or not early_release(level) or reader == "xact_status":
        return True
    return reader == "durable" and base_fault(fault) in ("kill", "power")


@dataclass
class NodeCheck:
    node: str               # which node was checked ("primary", "promoted", "rejoined")
    acked: int = 0
    acked_lost: int = 0
    lost_examples: list = field(default_factory=list)
    torn: int = 0
    torn_examples: list = field(default_factory=list)
    in_doubt: int = 0
    in_doubt_committed: int = 0
    status_lied: int = 0
    reads: dict = field(default_factory=dict)          # reader kind -> reads made
    reads_lost: dict = field(default_factory=dict)     # reader kind -> reads that saw a lost commit
    reads_lost_commits: int = 0                        # the farthest such read: commits ahead of the node
    reads_lost_ms: float | None = None                 # its time before the fault
    prepared_left: int = 0
    tables_missing: bool = False
    # for a node that follows the serving one: rows (and the hot value) of
    # the cycle that differ from the serving node's, once it caught up
    diverged: int | None = None
    follow_error: str | None = None  # it could not follow the serving node at all

    def asdict(self) -> dict:
        return dict(self.__dict__)


def xact_status(conn, txid: int) -> str | None:
    """pg_xact_status, or None for an xid the node never assigned (a promoted
    standby that did not get that far: "transaction ID ... is in the future")."""
    try:
        return conn.execute("SELECT pg_xact_status(%s::text::xid8)", (txid,)).fetchone()[0]
    except psycopg.errors.InvalidParameterValue:
        return None


def check_node(conn, load: Load, node: str, statuses: bool = True) -> NodeCheck:
    """Compare the node's rows for the cycle with the ledger; `conn` is an
    autocommit connection to the recovered node.  `statuses`: also compare
    the in-doubt commits' pg_xact_status with their rows.  Only on the node
    checked first after the fault, before anything new runs: an XID whose
    WAL the fault took is handed out again after recovery (or on the other
    branch, after a failover), and a follower checked later reports the new
    transaction's status (seen: "committed" for a lost in-doubt commit's XID
    once a later commit reused it)."""
    cyc = load.cycle
    res = NodeCheck(node)
    parts: dict[tuple[int, int], tuple] = {}
    try:
        for writer, seq, ps in conn.execute("SELECT writer, seq, array_agg(part ORDER BY part) FROM audit_rows "
                                            "WHERE cycle = %s GROUP BY writer, seq", (cyc,)):
            parts[(writer, seq)] = tuple(ps)
        row = conn.execute("SELECT v FROM audit_hot WHERE cycle = %s", (cyc,)).fetchone()
    except psycopg.errors.UndefinedTable:
        res.tables_missing = True  # lost with everything in them
        row = None
    hot = row[0] if row else 0
    newest: dict[int, int] = {HOT: hot}
    for (writer, seq) in parts:
        newest[writer] = max(newest.get(writer, 0), seq)
    kinds = {w.writer: w.kind for w in load.writers}

    for w in load.writers:
        for c in w.acked:
            res.acked += 1
            present = c.seq <= hot if w.kind == "hot" else (w.writer, c.seq) in parts
            if not present:
                res.acked_lost += 1
                if len(res.lost_examples) < 5:
                    res.lost_examples.append(f"{w.kind} writer {w.writer} seq {c.seq} (xid {c.txid})")
        if w.in_doubt is not None and statuses:
            res.in_doubt += 1
            st = xact_status(conn, w.in_doubt.txid)
            if w.kind == "hot":
                # the hot row's value does not say whose increment it holds;
                # the writer's own in-doubt increment is there iff v exceeds
                # every acknowledged one by the in-doubt count (not checked)
                present = None
            else:
                present = (w.writer, w.in_doubt.seq) in parts
            if st == "committed":
                res.in_doubt_committed += 1
            if present is not None and present != (st == "committed") and st != "in progress":
                res.status_lied += 1
                if len(res.lost_examples) < 10:
                    res.lost_examples.append(f"in doubt: {w.kind} writer {w.writer} seq {w.in_doubt.seq} "
                                             f"xid {w.in_doubt.txid}: status {st}, rows present {present}")
    for (writer, seq), ps in parts.items():
        want = EXPECTED_PARTS.get(kinds.get(writer, ""))
        if want is not None and ps != want:
            res.torn += 1
            if len(res.torn_examples) < 5:
                res.torn_examples.append(f"{kinds[writer]} writer {writer} seq {seq}: parts {list(ps)}")

    fault_at = load.fault_at
    for r in load.readers:
        res.reads[r.kind] = res.reads.get(r.kind, 0) + r.reads
        lost = 0
        for t, seen in r.seen:
            ahead = max((v - newest.get(k, 0) for k, v in seen.items()), default=0)
            if ahead > 0:
                lost += 1
                if ahead > res.reads_lost_commits:
                    res.reads_lost_commits = ahead
                if fault_at is not None:
                    ms = (fault_at - t) * 1000
                    res.reads_lost_ms = ms if res.reads_lost_ms is None else min(res.reads_lost_ms, ms)
        res.reads_lost[r.kind] = res.reads_lost.get(r.kind, 0) + lost
    res.prepared_left = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
                                     (f"audit\\_{cyc}\\_%",)).fetchone()[0]
    return res


def cycle_rows(conn, cycle: int) -> set:
    """The cycle's rows and hot value, to compare two nodes."""
    try:
        rows = {r for r in conn.execute("SELECT writer, seq, part FROM audit_rows WHERE cycle = %s", (cycle,))}
        rows |= {("hot", v) for (v,) in conn.execute("SELECT v FROM audit_hot WHERE cycle = %s", (cycle,))}
    except psycopg.errors.UndefinedTable:
        return set()
    return rows


def violations(level: str, fault: str, chk: NodeCheck) -> list[str]:
    """What the node shows that the level does not allow."""
    out = []
    if chk.follow_error:
        out.append(f"could not follow the serving node ({chk.follow_error})")
    if chk.diverged:
        out.append(f"{chk.diverged} rows differ from the serving node's after catching up")
    if chk.acked_lost and acks_promised(level, fault):
        out.append(f"{chk.acked_lost} acknowledged commits lost ({'; '.join(chk.lost_examples)})")
    if chk.torn:
        out.append(f"{chk.torn} torn transactions ({'; '.join(chk.torn_examples)})")
    if chk.status_lied:
        out.append(f"{chk.status_lied} in-doubt commits whose pg_xact_status disagrees with their rows")
    for kind, n in chk.reads_lost.items():
        if n and reads_promised(level, fault, kind):
            out.append(f"{n} {kind} reads saw a commit that was then lost")
    return out
