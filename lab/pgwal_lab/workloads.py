"""pgbench workloads: TPC-B, hot counter, large transaction, insert.

Each workload knows how to create its data (`init`), optionally reset it
between runs (`reset`), and which pgbench script and protocol to run.
`run_pgbench` runs pgbench against a node (bounded in time) with the
per-transaction log on and returns TPS and latency statistics from it.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .util import LabError, run


@dataclass
class Workload:
    name: str
    script: str | None = None        # pgbench script text; None = builtin
    builtin: str | None = None       # e.g. "tpcb-like"
    protocol: str = "prepared"
    init_sql: list[str] = field(default_factory=list)
    reset_sql: list[str] = field(default_factory=list)
    pgbench_init: list[str] | None = None  # args for pgbench -i
    tables: list[str] = field(default_factory=list)  # sized before and after each run
    # pgbench -r: the script's statements' mean latencies ("statement_ms"),
    # and the COMMIT's on its own ("commit_ms") when the script has one
    per_command: bool = False

    def init(self, node, pg_bin: Path, timeout: float = 600) -> None:
        if self.pgbench_init is not None:
            run([pg_bin / "pgbench", "-i", "-q", *self.pgbench_init, *node.pgbench_target()],
                timeout=timeout)
        for s in self.init_sql:
            node.sql(s, timeout_s=timeout)

    def reset(self, node) -> None:
        for s in self.reset_sql:
            node.sql(s)

    def vacuum(self, node) -> float | None:
        """VACUUM the workload's tables; seconds taken (None: no tables)."""
        if not self.tables:
            return None
        t0 = time.monotonic()
        node.sql(f"VACUUM {', '.join(self.tables)}", timeout_s=600)
        return time.monotonic() - t0

    def table_stats(self, node) -> dict | None:
        """On-disk bytes (with indexes and TOAST) and dead row versions of the
        workload's tables: a table that grows from run to run makes later
        runs slower, which interleaving spreads evenly but a lone run hides."""
        if not self.tables:
            return None
        r = node.sql("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0), "
                     "coalesce(sum(pg_stat_get_dead_tuples(c.oid)), 0) "
                     "FROM pg_class c WHERE c.oid = ANY (%s::regclass[])", (self.tables,))[0]
        return {"bytes": int(r[0]), "dead_rows": int(r[1])}

    def describe(self) -> dict:
        return {"name": self.name, "builtin": self.builtin, "script": self.script, "protocol": self.protocol,
                "pgbench_init": self.pgbench_init, "per_command": self.per_command}


def tpcb(scale: int = 10, fillfactor: int = 100, select_only: bool = False, skip_some: bool = False) -> Workload:
    b = "select-only" if select_only else ("simple-update" if skip_some else "tpcb-like")
    return Workload("tpcb", builtin=b, pgbench_init=["-s", str(scale), "-F", str(fillfactor)],
                    tables=["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"])


def hot_counter() -> Workload:
    return Workload(
        "hot-counter",
        script="UPDATE counters SET counter = counter + 1 WHERE id = 0;\n",
        tables=["counters"],
        init_sql=["DROP TABLE IF EXISTS counters",
                  "CREATE TABLE counters (id int PRIMARY KEY, counter bigint NOT NULL)",
                  "INSERT INTO counters VALUES (0, 0)"],
    )


def counter_reader() -> Workload:
    """Reads the hot counter (one SELECT per transaction)."""
    return Workload("counter-reader", script="SELECT counter FROM counters WHERE id = 0;\n")


def large_txn(rows: int = 80, row_bytes: int = 8000, tables: int = 32, commit_apart: bool = False) -> Workload:
    """`rows` rows of `row_bytes` bytes into one of `tables` tables per
    transaction.  The payload repeats an md5, so TOAST compresses it:
    WAL per transaction is measured, not assumed.  `commit_apart`: BEGIN,
    INSERT and COMMIT as three statements, with pgbench -r timing each, so
    the COMMIT's own latency (flush and standby wait) is measured apart
    from the INSERT's."""
    reps = max(1, row_bytes // 32)
    insert = (f"INSERT INTO large_:t (payload) SELECT repeat(md5(random()::text), {reps}) "
              f"FROM generate_series(1, {rows});\n")
    script = f"\\set t random(0, {tables - 1})\n" + (f"BEGIN;\n{insert}COMMIT;\n" if commit_apart else insert)
    init = []
    for i in range(tables):
        init += [f"DROP TABLE IF EXISTS large_{i}", f"CREATE TABLE large_{i} (id bigserial, payload text)"]
    names = [f"large_{i}" for i in range(tables)]
    return Workload("large-txn", script=script, protocol="simple", init_sql=init, tables=names,
                    reset_sql=[f"TRUNCATE {', '.join(names)}"], per_command=commit_apart)


def insert() -> Workload:
    return Workload(
        "insert",
        script="\\set v random(1, 1000000)\nINSERT INTO ins (v, pad) VALUES (:v, repeat('x', 100));\n",
        init_sql=["DROP TABLE IF EXISTS ins", "CREATE TABLE ins (id bigserial PRIMARY KEY, v int, pad text)"],
        reset_sql=["TRUNCATE ins"],
        tables=["ins"],
    )


WORKLOADS = {"tpcb": tpcb, "hot-counter": hot_counter, "large-txn": large_txn, "insert": insert}

_TPS = re.compile(r"tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)")
_TPS_ANY = re.compile(r"tps = ([0-9.]+)")
_XACTS = re.compile(r"number of transactions actually processed: (\d+)")
_FAILED = re.compile(r"number of failed transactions: (\d+)")
# pgbench -r: "statement latencies in milliseconds[ and failures]:" then
# one line per statement: mean latency, [failures,] the statement's text
_STMT = re.compile(r"^\s+([0-9.]+)\s+(?:\d+\s+)?(\S.*)$")


def parse_statement_latencies(stdout: str) -> dict[str, float]:
    """Mean latency (ms) of each statement of a pgbench -r report, by text."""
    out: dict[str, float] = {}
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("statement latencies in milliseconds")]
    if not starts:
        return out
    for line in lines[starts[0] + 1:]:
        m = _STMT.match(line)
        if not m:
            break
        out[m.group(2).strip()] = float(m.group(1))
    return out


def parse_log_latencies(files) -> np.ndarray:
    """Latencies in microseconds from pgbench per-transaction log files
    (`client xact time script epoch usec [lag]`); skipped/failed excluded."""
    chunks = []
    for f in files:
        vals = []
        with open(f) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    vals.append(int(parts[2]))
        chunks.append(np.asarray(vals, dtype=np.int64))
    return np.concatenate(chunks) if chunks else np.array([], dtype=np.int64)


def latency_summary(lat_us: np.ndarray) -> dict:
    if lat_us.size == 0:
        return {"lat_mean_ms": None, "lat_p50_ms": None, "lat_p99_ms": None}
    return {"lat_mean_ms": float(lat_us.mean() / 1000), "lat_p50_ms": float(np.percentile(lat_us, 50) / 1000),
            "lat_p99_ms": float(np.percentile(lat_us, 99) / 1000)}


def failure_context(node) -> str:
    """What the servers of `node`'s cluster say about a failed run: each
    node's PANIC, FATAL, TRAP and 'terminated by signal' lines (the last
    ten) and the free space on its disk.  A client's error alone reads the
    same for a full pg_wal and a crash.  Empty for clusters the lab did not
    start (no server log to read)."""
    cluster = getattr(node, "cluster", None)
    nodes = list(cluster.nodes.values()) if cluster is not None else []
    parts = []
    for n in nodes:
        lines = [ln for ln in n.log_tail(2000).splitlines()
                 if any(k in ln for k in ("PANIC:", "FATAL:", "TRAP:", "terminated by signal"))]
        try:
            du = shutil.disk_usage(n.datadir)
            disk = f"{du.free / 2**20:.0f} MB free of {du.total / 2**20:.0f} MB"
        except OSError:
            disk = "disk not mounted"
        parts.append(f"\n--- {n.name}: {disk}" + ("".join(f"\n  {ln}" for ln in lines[-10:]) or "\n  (no PANIC, FATAL or TRAP in its log)"))
    return "".join(parts)


def run_pgbench(node, pg_bin: Path, wl: Workload, clients: int, duration: float | None = None,
                transactions: int | None = None, threads: int | None = None, log: bool = True,
                extra: list[str] | None = None, timeout: float | None = None, env: dict | None = None) -> dict:
    """Run pgbench against `node`; returns tps, transactions and latency stats.
    `env` adds environment variables (e.g. PGAPPNAME, PGOPTIONS)."""
    threads = threads or max(1, min(clients, os.cpu_count() or 2))
    with tempfile.TemporaryDirectory(prefix="pgwal-pgbench-") as tmp:
        cmd = [str(pg_bin / "pgbench"), "-n", "-c", str(clients), "-j", str(threads), "-M", wl.protocol]
        if duration is not None:
            cmd += ["-T", str(max(1, int(round(duration))))]
        elif transactions is not None:
            cmd += ["-t", str(transactions)]
        else:
            raise LabError("run_pgbench needs duration or transactions")
        if wl.builtin:
            cmd += ["-b", wl.builtin]
        else:
            script = Path(tmp) / "script.sql"
            script.write_text(wl.script)
            cmd += ["-f", str(script)]
        if log:
            cmd += ["-l", f"--log-prefix={tmp}/pgbench_log"]
        if wl.per_command:
            cmd += ["-r"]
        cmd += list(extra or []) + node.pgbench_target()
        limit = timeout or ((duration or 0) + 120 if duration else 600)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=tmp,
                               env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"pgbench exceeded {limit}s") from e
        if p.returncode != 0:
            raise LabError(f"pgbench failed ({p.returncode}): {p.stderr[-1500:]}{failure_context(node)}")
        m = _TPS.search(p.stdout) or _TPS_ANY.search(p.stdout)
        res = {"tps": float(m.group(1)) if m else None,
               "transactions": int(_XACTS.search(p.stdout).group(1)) if _XACTS.search(p.stdout) else None,
               "failed": int(_FAILED.search(p.stdout).group(1)) if _FAILED.search(p.stdout) else 0,
               "clients": clients, "threads": threads}
        if log:
            res.update(latency_summary(parse_log_latencies(sorted(glob.glob(f"{tmp}/pgbench_log*")))))
        if wl.per_command:
            stmts = parse_statement_latencies(p.stdout)
            if not stmts:
                raise LabError(f"pgbench -r printed no statement latencies: {p.stdout[-1500:]}")
            res["statement_ms"] = stmts
            commits = [v for k, v in stmts.items() if k.upper().startswith(("COMMIT", "END"))]
            res["commit_ms"] = commits[0] if commits else None
        return res
