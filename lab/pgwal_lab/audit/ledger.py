"""The audit's workload: writers that keep a ledger of what was acknowledged,
readers that keep a ledger of what they saw.

Every cycle writes rows of its own (`cycle` column) and a hot row of its own.
A writer is one session running one kind of transaction in a loop; each
transaction carries the writer's next sequence number, so a writer's commits
are ordered and "seq 41 is there but 42 is not" means 42 was lost.  A
transaction enters the ledger only after COMMIT (or COMMIT PREPARED)
returned; the one in flight when the fault came is *in doubt*, recorded with
its xid so that after recovery its pg_xact_status can be compared with its
rows.

Kinds:
  hot       UPDATE one row per cycle (v = v + 1 RETURNING v): the row lock is
            held across the commit, where early release matters
  spread    one-row INSERT
  large     50 rows of 4 kB in one transaction (atomicity: all or none)
  2pc       INSERT, PREPARE TRANSACTION, COMMIT PREPARED
  subxact   INSERT; SAVEPOINT; INSERT; ROLLBACK TO; INSERT (parts 0 and 2
            must be there, part 1 never)

Readers run until the fault:
  plain        autocommit SELECT of each writer's newest seq and the hot value
  block        the same inside BEGIN ISOLATION LEVEL REPEATABLE READ ... COMMIT
  for_update   SELECT v ... FOR UPDATE of the hot row (waits for its row lock)
  durable      plain with durable_snapshots = on (patched server only)
  xact_status  pg_xact_status() of the xid each writer is committing now;
               "committed" is recorded as seen
  standby      plain, on a hot standby (`standby_conninfo`; the history
               explorer's): a standby replays only WAL its primary flushed,
               so what it shows survives the primary's crash at every level
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psycopg

WRITER_KINDS = ("hot", "hot", "spread", "large", "2pc", "subxact")
READER_KINDS = ("plain", "block", "for_update", "durable", "xact_status")
LARGE_PARTS = 50
EXPECTED_PARTS = {"spread": (0,), "large": tuple(range(LARGE_PARTS)), "2pc": (0,), "subxact": (0, 2)}
HOT = -1  # the hot row's key in a reader's observations

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_rows (
    cycle int, writer int, seq int, part int, payload text,
    PRIMARY KEY (cycle, writer, seq, part));
CREATE TABLE IF NOT EXISTS audit_hot (cycle int PRIMARY KEY, v bigint NOT NULL);
"""


@dataclass
class Commit:
    seq: int
    txid: int
    t: float            # time.monotonic() when COMMIT returned (acked) or was sent (in doubt)
    gid: str | None = None


@dataclass
class WriterLedger:
    writer: int
    kind: str
    acked: list[Commit] = field(default_factory=list)
    in_doubt: Commit | None = None
    error: str | None = None          # why the writer stopped
    error_before_fault: bool = False  # it stopped before the fault: the cycle is void


@dataclass
class ReaderLedger:
    kind: str
    reads: int = 0
    # (time the read was sent, {writer or HOT: newest seq or hot value seen}) per read
    seen: list[tuple[float, dict]] = field(default_factory=list)
    error: str | None = None
    error_before_fault: bool = False


class Load:
    """The writers and readers of one cycle, on one primary."""

    def __init__(self, conninfo: str, cycle: int, session: dict, reader_kinds: list[str],
                 writer_kinds=WRITER_KINDS, statement_timeout_s: float = 60, standby_conninfo: str | None = None):
        self.conninfo = conninfo
        self.standby_conninfo = standby_conninfo  # where a "standby" reader reads
        self.cycle = cycle
        self.session = session  # SET name = value for writers (the level)
        self.stop = threading.Event()
        self.fault_at: float | None = None  # set by the caller just before the fault
        self.timeout_ms = int(statement_timeout_s * 1000)
        self.writers = [WriterLedger(i, k) for i, k in enumerate(writer_kinds)]
        self.readers = [ReaderLedger(k) for k in reader_kinds]
        self.committing: dict[int, tuple[int, int]] = {}  # writer -> (seq, txid) whose COMMIT is in flight
        self.threads: list[threading.Thread] = []
        # the cycle's rows and hot value when its step ended (the history
        # explorer's verdict records them; None before)
        self.settled: tuple[frozenset, int] | None = None

    # lifecycle
    def start(self) -> None:
        for w in self.writers:
            self.threads.append(threading.Thread(target=self._writer, args=(w,), daemon=True))
        for r in self.readers:
            self.threads.append(threading.Thread(target=self._reader, args=(r,), daemon=True))
        for t in self.threads:
            t.start()

    def acked_count(self) -> int:
        return sum(len(w.acked) for w in self.writers)

    def wait_for_ack(self, timeout: float) -> bool:
        """Until some writer saw a COMMIT acknowledged (True), a writer
        failed, or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while self.acked_count() == 0:
            if time.monotonic() > deadline or any(w.error for w in self.writers):
                return False
            time.sleep(0.01)
        return True

    def finish(self, timeout: float = 90) -> None:
        """After the fault: every session ends with an error or at `stop`."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            raise TimeoutError("audit sessions did not end after the fault")

    def _connect(self, conninfo: str | None = None) -> psycopg.Connection:
        c = psycopg.connect(conninfo or self.conninfo, autocommit=True, connect_timeout=10)
        c.execute(f"SET statement_timeout = {self.timeout_ms}")
        return c

    def _failed(self, led, e: BaseException) -> None:
        led.error = f"{type(e).__name__}: {str(e).strip()[:200]}"
        # a standby's reads end whenever a fault touches that standby (or a
        # recovery conflict cancels one); what it saw is judged all the same
        led.error_before_fault = self.fault_at is None and getattr(led, "kind", None) != "standby"

    # writers
    def _writer(self, w: WriterLedger) -> None:
        try:
            conn = self._connect()
            for k, v in self.session.items():
                conn.execute(f"SET {k} = '{v}'")
        except Exception as e:  # noqa: BLE001 - recorded, the cycle is void
            self._failed(w, e)
            return
        seq = 0
        cyc = self.cycle
        with conn:
            while not self.stop.is_set():
                seq += 1
                pending = None
                try:
                    conn.execute("BEGIN")
                    txid = conn.execute("SELECT txid_current()").fetchone()[0]
                    if w.kind == "hot":
                        seq = conn.execute("UPDATE audit_hot SET v = v + 1 WHERE cycle = %s RETURNING v",
                                           (cyc,)).fetchone()[0]
                    elif w.kind == "large":
                        conn.execute("INSERT INTO audit_rows SELECT %s, %s, %s, g, repeat(md5(g::text), 125) "
                                     "FROM generate_series(0, %s) g", (cyc, w.writer, seq, LARGE_PARTS - 1))
                    elif w.kind == "subxact":
                        conn.execute("INSERT INTO audit_rows VALUES (%s, %s, %s, 0, 'a')", (cyc, w.writer, seq))
                        conn.execute("SAVEPOINT s")
                        conn.execute("INSERT INTO audit_rows VALUES (%s, %s, %s, 1, 'rolled back')",
                                     (cyc, w.writer, seq))
                        conn.execute("ROLLBACK TO SAVEPOINT s")
                        conn.execute("INSERT INTO audit_rows VALUES (%s, %s, %s, 2, 'c')", (cyc, w.writer, seq))
                    else:  # spread, 2pc
                        conn.execute("INSERT INTO audit_rows VALUES (%s, %s, %s, 0, 'x')", (cyc, w.writer, seq))
                    gid = f"audit_{cyc}_{w.writer}_{seq}" if w.kind == "2pc" else None
                    pending = Commit(seq, txid, time.monotonic(), gid)
                    self.committing[w.writer] = (seq, txid)
                    if gid:
                        conn.execute(f"PREPARE TRANSACTION '{gid}'")
                        conn.execute(f"COMMIT PREPARED '{gid}'")
                    else:
                        conn.execute("COMMIT")
                    pending.t = time.monotonic()
                    w.acked.append(pending)
                    self.committing.pop(w.writer, None)
                except Exception as e:  # noqa: BLE001 - the fault, or a defect the report shows
                    w.in_doubt = pending
                    self._failed(w, e)
                    return

    # readers
    def _reader(self, r: ReaderLedger) -> None:
        try:
            conn = self._connect(self.standby_conninfo if r.kind == "standby" else None)
            if r.kind == "durable":
                conn.execute("SET durable_snapshots = on")
        except Exception as e:  # noqa: BLE001
            self._failed(r, e)
            return
        cyc = self.cycle
        newest = ("SELECT writer, max(seq) FROM audit_rows WHERE cycle = %(c)s GROUP BY writer "
                  f"UNION ALL SELECT {HOT}, v FROM audit_hot WHERE cycle = %(c)s")
        with conn:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    if r.kind == "for_update":
                        rows = [(HOT, v) for (v,) in conn.execute(
                            "SELECT v FROM audit_hot WHERE cycle = %s FOR UPDATE", (cyc,))]
                    elif r.kind == "block":
                        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                        rows = conn.execute(newest, {"c": cyc}).fetchall()
                        conn.execute("COMMIT")
                    elif r.kind == "xact_status":
                        rows = []
                        for writer, (seq, txid) in list(self.committing.items()):
                            st = conn.execute("SELECT pg_xact_status(%s::text::xid8)", (txid,)).fetchone()[0]
                            if st == "committed":
                                rows.append((writer if self.writers[writer].kind != "hot" else HOT, seq))
                        if not rows:
                            time.sleep(0.001)
                    else:
                        rows = conn.execute(newest, {"c": cyc}).fetchall()
                    r.reads += 1
                    if rows:
                        seen: dict = {}
                        for k, v in rows:
                            seen[k] = max(seen.get(k, v), v)
                        r.seen.append((sent, seen))
                except Exception as e:  # noqa: BLE001
                    self._failed(r, e)
                    return


def prepare_cycle(conn: psycopg.Connection, cycle: int) -> None:
    """Empty tables (the previous cycle was checked; its rows would only
    fill the disk over thousands of cycles) with the cycle's hot row."""
    conn.execute(SCHEMA)
    conn.execute("TRUNCATE audit_rows, audit_hot")
    conn.execute("INSERT INTO audit_hot VALUES (%s, 0)", (cycle,))
