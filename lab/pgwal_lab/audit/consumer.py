"""A change-data consumer for the audit: `pgwal stream --acks stdin` applied
into a copy of the ledger tables, exactly once.

Run as its own process (`python -m pgwal_lab.audit.consumer ...`), so that
the audit can SIGKILL it, with the pgwal it starts.  Each source transaction
is applied in one target transaction that also records its commit end_lsn
(`consumer_progress`, and a row in `consumer_applied`); only after that
COMMIT returned is the end_lsn written back to pgwal, which acknowledges it
to the slot.  On start the consumer reads its progress, passes it to pgwal
as --start-lsn and skips every transaction whose end_lsn is not beyond it:
those were applied before a crash that came before their acknowledgement
reached the slot, and pgwal delivers them again (with --from-slot, which the
audit uses on every other start, it does not pass --start-lsn, so that all
of them come again).

`consumer_applied` has no key on purpose, nor has the copy of audit_rows:
a transaction applied twice shows up as duplicate rows there instead of
stopping the consumer, and the audit counts them.

Deliberate faults for the audit's chosen moments and its control:
  --crash-after-commit N   exit (os._exit) at the Nth transaction it applies,
                           after its apply committed and before its
                           acknowledgement: it is delivered again
  --ack-before-apply       acknowledge first, then apply (a broken consumer;
                           with --crash-after-commit it exits between the
                           two, and the transaction is lost)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psycopg
from psycopg import sql

COPY_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_rows (cycle int, writer int, seq int, part int, payload text);
CREATE TABLE IF NOT EXISTS audit_hot (cycle int, v bigint NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL);
CREATE TABLE IF NOT EXISTS consumer_applied (slot text, end_lsn pg_lsn, xid bigint, pid int);
"""

KEYS = {"audit_rows": ("cycle", "writer", "seq", "part"), "audit_hot": ("cycle",)}


def lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _where(key: dict, table: str) -> tuple[sql.Composable, list]:
    cols = KEYS[table]
    return (sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols),
            [key[c] for c in cols])


def apply_change(cur, ev: dict) -> None:
    """One insert/update/delete/truncate of the source, on the copy."""
    kind = ev["type"]
    if kind == "truncate":
        names = [t.split(".", 1)[1] for t in ev["tables"]]
        cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(sql.Identifier(n) for n in names)))
        return
    table = ev["table"]
    if table not in KEYS:
        raise ValueError(f"a change of a table the audit does not publish: {table}")
    if kind == "insert":
        new = ev["new"]
        cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in new),
            sql.SQL(", ").join(sql.Placeholder() * len(new))), list(new.values()))
    elif kind == "update":
        new = {c: v for c, v in ev["new"].items() if not isinstance(v, dict)}  # unchanged TOAST stays
        where, args = _where(ev.get("key") or ev.get("old") or ev["new"], table)
        cur.execute(sql.SQL("UPDATE {} SET {} WHERE {}").format(
            sql.Identifier(table), sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in new),
            where), [*new.values(), *args])
    elif kind == "delete":
        where, args = _where(ev["key"], table)
        cur.execute(sql.SQL("DELETE FROM {} WHERE {}").format(sql.Identifier(table), where), args)
    else:
        raise ValueError(f"unexpected change {kind}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pgwal", required=True, help="the pgwal binary")
    p.add_argument("--source", required=True, help="conninfo of the published database")
    p.add_argument("--target", required=True, help="conninfo of the copy")
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True)
    p.add_argument("--log", required=True, help="file that gets one JSON line per start and per skip")
    p.add_argument("--crash-after-commit", type=int, default=0)
    p.add_argument("--ack-before-apply", action="store_true")
    p.add_argument("--from-slot", action="store_true",
                   help="start where the slot is (no --start-lsn): what was applied but not yet "
                        "acknowledged comes again and is skipped")
    a = p.parse_args(argv)

    target = psycopg.connect(a.target, autocommit=True, connect_timeout=10)  # transaction() = BEGIN..COMMIT
    with target.transaction():
        target.execute(COPY_SCHEMA)
    row = target.execute("SELECT end_lsn::text FROM consumer_progress WHERE slot = %s", (a.slot,)).fetchone()
    source = psycopg.connect(a.source, autocommit=True, connect_timeout=10) if a.ack_before_apply else None
    progress = row[0] if row else None
    log = open(a.log, "a", buffering=1)
    log.write(json.dumps({"start": progress, "pid": os.getpid()}) + "\n")

    cmd = [a.pgwal, "-d", a.source, "stream", "-S", a.slot, "-P", a.publication, "--acks", "stdin",
           "--status-interval", "0.2"]
    if progress and not a.from_slot:
        cmd += ["--start-lsn", progress]
    pg = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    txn: list[dict] = []
    xid = None
    commits = 0

    def ack(end: str) -> None:
        pg.stdin.write(end + "\n")
        pg.stdin.flush()

    for line in pg.stdout:
        ev = json.loads(line)
        kind = ev["type"]
        if kind == "begin":
            txn, xid = [], ev["xid"]
        elif kind == "reconnect":
            txn = []  # a transaction cut short is delivered again, whole
        elif kind in ("insert", "update", "delete", "truncate"):
            txn.append(ev)
        elif kind == "commit":
            end = ev["end_lsn"]
            if progress and lsn(end) <= lsn(progress):
                log.write(json.dumps({"skipped": end}) + "\n")
                ack(end)
                continue
            commits += 1
            crash = a.crash_after_commit and commits >= a.crash_after_commit
            if a.ack_before_apply:
                ack(end)
                if crash:
                    # the chosen moment: the slot has the acknowledgement
                    # (pgwal's next status update), the copy not the apply
                    while pg.poll() is None and source.execute(
                            "SELECT confirmed_flush_lsn < %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                            (end, a.slot)).fetchone()[0]:
                        time.sleep(0.01)
                    os._exit(9)  # acknowledged, never applied
            with target.transaction():
                with target.cursor() as cur:
                    for change in txn:
                        apply_change(cur, change)
                    cur.execute("INSERT INTO consumer_applied VALUES (%s, %s, %s, %s)",
                                (a.slot, end, xid, os.getpid()))
                    cur.execute("INSERT INTO consumer_progress VALUES (%s, %s) ON CONFLICT (slot) "
                                "DO UPDATE SET end_lsn = excluded.end_lsn", (a.slot, end))
            progress = end
            if not a.ack_before_apply:
                if crash:
                    os._exit(9)  # applied and committed, never acknowledged
                ack(end)
    # pgwal ended: killed, or it failed (its error is on our stderr)
    return 2 if pg.wait() else 0


if __name__ == "__main__":
    sys.exit(main())
