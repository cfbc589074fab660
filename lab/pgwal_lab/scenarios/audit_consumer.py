"""audit-consumer: a change-data consumer applies the ledger workload into a
copy, exactly once, while its stream is broken again and again.

One server (wal_level = logical).  The ledger writers (audit/ledger.py: hot
row, inserts, 200 kB transactions, 2PC, subtransactions with a rolled-back
savepoint) write the published tables; the consumer (audit/consumer.py, its
own process) runs `pgwal stream --acks stdin` and applies each transaction
into a copy in another database, recording its end_lsn in the same
transaction and acknowledging it only after that commit.  During each cycle
`faults_per_cycle` faults come at random moments, each one of:

  walsender      pg_terminate_backend() of the slot's walsender: pgwal
                 reconnects and delivers again what was not acknowledged
  consumer-kill  SIGKILL of the consumer and its pgwal together (a crashed
                 host): the next consumer starts from its own progress
  pgwal-kill     SIGKILL of pgwal alone: the consumer sees its output end,
                 exits, and is started again
  crash-at       chosen moment: the consumer exits right after its Nth apply
                 committed and before that apply's acknowledgement
                 (--crash-after-commit): pgwal delivers the transaction again
                 and the consumer must skip it

Then the writers stop, the consumer catches up (the slot's confirmed
position passes the server's WAL end), and the copy is compared with the
source: rows missing from the copy, rows only in the copy, rows there twice,
the hot value, and transactions applied twice (consumer_applied).

Modes: `exact` (the consumer above), and the control `ack-before-apply`, a
consumer that acknowledges before it applies: its crash-at faults come
between the two, and the audit must see the transactions it lost.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from .. import topology
from ..audit import check, faults
from ..audit.ledger import Load, prepare_cycle
from ..util import LAB_DIR, LabError, pgwal_binary, wait_for
from . import Context, as_list

NAME = "audit-consumer"
FAULT_KINDS = ("walsender", "consumer-kill", "pgwal-kill", "crash-at")
MODES = ("exact", "ack-before-apply")
DEFAULTS = {"cycles": 100, "modes": list(MODES), "load_s": [1.0, 3.0], "faults_per_cycle": 3, "seed": 1}
SMOKE = {"cycles": 2, "load_s": [0.5, 1.0]}
SLOT, PUBLICATION, COPY_DB = "audit_consumer", "audit_pub", "audit_copy"
SETTINGS = {"wal_level": "logical", "max_prepared_transactions": 20, "max_replication_slots": 10,
            "max_wal_senders": 10, "log_min_messages": "warning", "shared_buffers": "128MB"}


class Consumer:
    """The consumer process (and the pgwal it runs), restarted when it ends."""

    def __init__(self, primary, workdir: Path, mode: str):
        self.primary = primary
        self.mode = mode
        self.log = workdir / "consumer.log"
        self.errlog = workdir / "consumer.stderr"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[int] = []

    def start(self, crash_after_commit: int = 0) -> None:
        cmd = [sys.executable, "-m", "pgwal_lab.audit.consumer", "--pgwal", str(pgwal_binary()),
               "--source", self.primary.conninfo(), "--target", self.primary.conninfo(COPY_DB),
               "--slot", SLOT, "--publication", PUBLICATION, "--log", str(self.log)]
        if crash_after_commit:
            cmd += ["--crash-after-commit", str(crash_after_commit)]
        if self.mode == "ack-before-apply":
            cmd.append("--ack-before-apply")
        if self.starts % 2:
            cmd.append("--from-slot")  # every other start: the redelivered transactions are skipped
        with open(self.errlog, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                         cwd=str(LAB_DIR))
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> None:
        """Note how a consumer that ended did, and wait until its slot is free."""
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append(self.proc.returncode)
            self.proc = None
        wait_for(lambda: not self.primary.scalar(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)), 30,
            "the slot to be released by the ended consumer")

    def ensure(self) -> None:
        if not self.alive():
            self.reap()
            self.start()

    def kill(self, pgwal_only: bool = False) -> None:
        if not self.alive():
            return
        if pgwal_only:
            # a consumer just started may not have started its pgwal yet
            deadline = time.monotonic() + 30
            while not (kids := faults.children(self.proc.pid)) and self.alive():
                if time.monotonic() > deadline:
                    raise LabError(f"the consumer started no pgwal in 30 s:\n{self.stderr_tail()}")
                time.sleep(0.01)
            faults.signal_all(kids, signal.SIGKILL)
            self.proc.wait(timeout=30)  # it exits when pgwal's output ends
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.reap()

    def stderr_tail(self, n: int = 10) -> str:
        try:
            return "\n".join(self.errlog.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def skipped(self) -> int:
        """Transactions delivered again and skipped (already applied)."""
        n = 0
        try:
            for line in self.log.read_text(errors="replace").splitlines():
                try:
                    n += "skipped" in json.loads(line)
                except ValueError:
                    pass  # a line cut short by a kill
        except OSError:
            pass
        return n


ROWS = "SELECT writer, seq, part, md5(payload) FROM audit_rows WHERE cycle = %s"


def compare(primary, cycle: int, load: Load) -> dict:
    """The copy against the source, for one cycle; and every transaction the
    writers had acknowledged against the copy's record of applied ones (a
    lost hot-row increment is invisible in the final value, which the next
    increment sets)."""
    with primary.connect() as s, primary.connect(COPY_DB) as c:
        src = s.execute(ROWS, (cycle,)).fetchall()
        cpy = c.execute(ROWS, (cycle,)).fetchall()
        src_hot = s.execute("SELECT v FROM audit_hot WHERE cycle = %s", (cycle,)).fetchall()
        cpy_hot = c.execute("SELECT v FROM audit_hot WHERE cycle = %s", (cycle,)).fetchall()
        twice = c.execute("SELECT count(*) FROM (SELECT end_lsn FROM consumer_applied GROUP BY end_lsn "
                          "HAVING count(*) > 1) d").fetchone()[0]
        applied = dict(c.execute("SELECT xid, count(*) FROM consumer_applied GROUP BY xid").fetchall())
    src_set, cpy_set = set(src), set(cpy)
    acked = [x.txid & 0xFFFFFFFF for w in load.writers for x in w.acked]
    return {"rows": len(src), "missing": len(src_set - cpy_set), "extra": len(cpy_set - src_set),
            "acked_not_applied": sum(1 for x in acked if x not in applied),
            "duplicate_rows": len(cpy) - len(cpy_set), "hot_source": [v for (v,) in src_hot],
            "hot_copy": [v for (v,) in cpy_hot], "applied_twice": twice, "applied": sum(applied.values())}


def violations(mode: str, cmp: dict, source_lost: int) -> list[str]:
    out = []
    if source_lost:
        out.append(f"{source_lost} acknowledged commits missing on the source (no server fault ran)")
    if mode != "exact":
        return out
    if cmp["missing"]:
        out.append(f"{cmp['missing']} source rows missing from the copy")
    if cmp["acked_not_applied"]:
        out.append(f"{cmp['acked_not_applied']} transactions the writers had acknowledged never applied")
    if cmp["extra"]:
        out.append(f"{cmp['extra']} rows in the copy that the source does not have")
    if cmp["duplicate_rows"] or cmp["applied_twice"]:
        out.append(f"applied twice: {cmp['applied_twice']} transactions, {cmp['duplicate_rows']} rows")
    if cmp["hot_source"] != cmp["hot_copy"]:
        out.append(f"hot row {cmp['hot_copy']} in the copy, {cmp['hot_source']} on the source")
    return out


def run_cycle(cluster, consumer: Consumer, cycle: int, load_s: float, plan: list[tuple[float, str]],
              rng: random.Random) -> dict:
    primary = cluster.primary
    consumer.ensure()
    with primary.connect() as c:
        prepare_cycle(c, cycle)
    load = Load(primary.conninfo(), cycle, {"synchronous_commit": "on"}, [])
    skipped0, starts0, exits0 = consumer.skipped(), consumer.starts, len(consumer.exits)
    load.start()
    t0 = time.monotonic()
    done = []
    for at, kind in plan:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        consumer.ensure()
        if kind == "walsender":
            # the consumer (re)started by the previous fault may not stream yet
            until = time.monotonic() + 10
            while time.monotonic() < until and consumer.alive() and not primary.scalar(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)):
                time.sleep(0.01)
            n = primary.scalar("SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots "
                               "WHERE slot_name = %s AND active_pid IS NOT NULL", (SLOT,))
            done.append(kind if n else "walsender (none active)")
        elif kind == "consumer-kill":
            consumer.kill()
            consumer.start()
            done.append(kind)
        elif kind == "pgwal-kill":
            consumer.kill(pgwal_only=True)
            consumer.start()
            done.append(kind)
        else:  # crash-at: the next consumer exits after its Nth apply, before acknowledging it
            consumer.kill()
            consumer.start(crash_after_commit=rng.randint(1, 20))
            done.append(kind)
    time.sleep(max(0.0, t0 + load_s - time.monotonic()))
    load.fault_at = time.monotonic()  # the writers stop cleanly: no session error is a fault's
    load.finish()
    end = primary.scalar("SELECT pg_current_wal_lsn()::text")
    # a consumer told to crash may not have reached its Nth apply yet: it
    # catches up (and crashes) now, and a normal one takes over
    deadline = time.monotonic() + 120
    while True:
        consumer.ensure()
        confirmed = primary.scalar("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                                   "WHERE slot_name = %s", (end, SLOT))
        if confirmed:
            break
        if time.monotonic() > deadline:
            slot = primary.sql("SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots "
                               "WHERE slot_name = %s", (SLOT,))
            raise LabError(f"the consumer did not catch up with {end} in 120 s (slot {slot}, consumer exits "
                           f"{consumer.exits}, alive {consumer.alive()}):\n{consumer.stderr_tail()}")
        time.sleep(0.1)
    cmp = compare(primary, cycle, load)
    with primary.connect() as c:
        source = check.check_node(c, load, "source", statuses=False)
    return {"cycle": cycle, "load_s": round(load_s, 3), "faults": done, "acked_total": source.acked,
            "compare": cmp, "redelivered_skipped": consumer.skipped() - skipped0,
            "consumer_starts": consumer.starts - starts0, "consumer_exits": consumer.exits[exits0:],
            "writer_errors": [w.error for w in load.writers if w.error],
            "void": any(w.error for w in load.writers), "source_lost": source.acked_lost}


def run(ctx: Context, params: dict) -> list[dict]:
    modes = [str(m) for m in as_list(params["modes"])]
    for m in modes:
        if m not in MODES:
            raise LabError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    lo, hi = (float(x) for x in as_list(params["load_s"]))
    rng = random.Random(int(params["seed"]))
    pgwal_binary()  # fail before building a cluster
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, settings=dict(SETTINGS), namespaces=False, disk_mb=1024)
    cluster = topology.Cluster(spec)
    records = []
    schedule = [m for _ in range(int(params["cycles"])) for m in modes]
    if ctx.set_total:
        ctx.set_total(len(schedule), None)
    with cluster:
        primary = cluster.primary
        with primary.connect() as c:
            prepare_cycle(c, 0)
            c.execute(f"CREATE DATABASE {COPY_DB}")
            c.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE audit_rows, audit_hot")
        common = dict(ctx.common, server_version=cluster.server_version(), params=params,
                      pgwal=str(pgwal_binary()))
        consumers: dict[str, Consumer] = {}
        workdir = primary.root
        try:
            for i, mode in enumerate(schedule):
                if ctx.deadline and time.monotonic() > ctx.deadline - 60:
                    ctx.log(f"audit-consumer: time limit reached after {i} of {len(schedule)} cycles")
                    break
                # each mode has its slot's history to itself: a fresh slot and copy per mode switch
                if mode not in consumers or len(modes) > 1:
                    for other in consumers.values():
                        other.kill()
                    _reset(primary)
                    consumers[mode] = Consumer(primary, workdir, mode)
                consumer = consumers[mode]
                load_s = rng.uniform(lo, hi)
                n = int(params["faults_per_cycle"])
                plan = sorted((rng.uniform(0.1, load_s), rng.choice(FAULT_KINDS)) for _ in range(n))
                if mode == "ack-before-apply":
                    plan[-1] = (plan[-1][0], "crash-at")  # the control's window, reached every cycle
                try:
                    rec = run_cycle(cluster, consumer, i + 1, load_s, plan, rng)
                except (LabError, psycopg.Error) as e:
                    # the cluster is torn down after this: keep what the server said
                    raise LabError(f"cycle {i + 1} ({mode}): {e}\n--- server log:\n{primary.log_tail(60)}") \
                        from None
                rec["violations"] = violations(mode, rec["compare"], rec["source_lost"])
                rec.update(common, scenario=NAME, group="consumer", variant=mode, mode=mode, run_id=ctx.run_id)
                ctx.store.append(rec)
                records.append(rec)
                if ctx.progress:
                    cmpd = rec["compare"]
                    ctx.progress(f"cycle {i + 1}: {mode}: {rec['faults']}: {cmpd['rows']} rows, missing "
                                 f"{cmpd['missing']}, not applied {cmpd['acked_not_applied']}, twice "
                                 f"{cmpd['applied_twice']}, redelivered {rec['redelivered_skipped']}, exits "
                                 f"{rec['consumer_exits']}" + (f" VIOLATION {rec['violations']}"
                                                                    if rec["violations"] else ""))
        finally:
            for c in consumers.values():
                c.kill()
    return records


def _reset(primary) -> None:
    """A new slot and an empty copy: the consumer starts from nothing."""
    with primary.connect() as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                  (SLOT,))
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    with primary.connect(COPY_DB) as c:
        c.execute("DROP TABLE IF EXISTS audit_rows, audit_hot, consumer_progress, consumer_applied")


def failures(records: list[dict]) -> str | None:
    """A promise broken in `exact` mode, or a control that lost nothing."""
    mine = [r for r in records if r.get("scenario") == NAME]
    bad = [f"cycle {r['cycle']} {r['mode']}: {'; '.join(r['violations'])}" for r in mine if r["violations"]]
    void = [f"cycle {r['cycle']}: {r['writer_errors']}" for r in mine if r.get("void")]
    control = [r for r in mine if r["mode"] == "ack-before-apply"]
    if control and not any(r["compare"]["acked_not_applied"] for r in control):
        bad.append(f"the control (ack-before-apply) lost nothing in {len(control)} cycles: the audit is blind")
    if not bad and not void:
        return None
    return "; ".join((bad + void)[:10])
