"""wal-volume: WAL bytes per wal_level (minimal / replica / logical) for a
bulk load (`pgbench -i`, fillfactor 70) and for an OLTP run of a fixed
number of TPC-B transactions after a checkpoint, primary alone.  Levels are
interleaved across iterations (the server is restarted for each).  The WAL
of each phase is broken down by record type and full-page images with
`pg_waldump --stats=record`, so the report can explain *why* it differs."""
from __future__ import annotations

import re
import time

from .. import topology
from ..util import LabError
from ..util import run as run_cmd
from ..workloads import run_pgbench, tpcb
from . import Context, as_list

NAME = "wal-volume"
DEFAULTS = {"levels": ["minimal", "replica", "logical"], "scale": 10, "fillfactor": 70,
            "oltp_transactions": 8000, "clients": 4, "iterations": 3}
SMOKE = {"scale": 1, "oltp_transactions": 200, "clients": 2, "iterations": 1}

_ROW = re.compile(r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)")
_TOTAL = re.compile(r"^Total\s+(\d+)\s+(\d+)\s+\[[^\]]*\]\s+(\d+)\s+\[[^\]]*\]\s+(\d+)")


def waldump_stats(node, start: str, end: str) -> dict:
    """Per record type: count, record bytes, FPI bytes, combined bytes."""
    p = run_cmd([node.bin("pg_waldump"), "-p", node.datadir / "pg_wal", "-s", start, "-e", end, "--stats=record"],
            timeout=300, check=False)
    out = {"types": {}, "total": None}
    for line in (p.stdout or "").splitlines():
        m = _ROW.match(line)
        if m and m.group(1) not in ("Type", "----"):
            out["types"][m.group(1)] = {"n": int(m.group(2)), "record": int(m.group(3)), "fpi": int(m.group(4)),
                                        "combined": int(m.group(5))}
            continue
        m = _TOTAL.match(line)
        if m:
            out["total"] = {"n": int(m.group(1)), "record": int(m.group(2)), "fpi": int(m.group(3)),
                            "combined": int(m.group(4))}
    if out["total"] is None:
        out["error"] = (p.stderr or "")[-500:]
    return out


def set_level(cluster, level: str) -> None:
    p = cluster.primary
    with p.connect() as c:
        c.execute(f"ALTER SYSTEM SET wal_level = '{level}'")
        c.execute(f"ALTER SYSTEM SET max_wal_senders = {0 if level == 'minimal' else 10}")
        c.execute(f"ALTER SYSTEM SET archive_mode = 'off'")
    p.restart()
    got = p.scalar("SHOW wal_level")
    if got != level:
        raise LabError(f"wal_level is {got}, wanted {level}")


def lsn(node) -> str:
    return node.scalar("SELECT pg_current_wal_insert_lsn()::text")


def diff(node, a: str, b: str) -> float:
    return float(node.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (b, a)))


def run(ctx: Context, params: dict) -> list[dict]:
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk="tmpfs")
    levels = as_list(params["levels"])
    iters = int(params["iterations"])
    wl = tpcb(scale=int(params["scale"]), fillfactor=int(params["fillfactor"]))
    records = []
    with topology.Cluster(spec) as cluster:
        p = cluster.primary
        if ctx.set_total:
            ctx.set_total(len(levels) * iters, None)
        # WAL volume does not depend on a disk's speed, but the build does
        common = dict(ctx.common, server_version=cluster.server_version(), topology="primary alone",
                      namespaces=cluster.use_ns, params=params, proof=cluster.prove())
        for it in range(iters):
            for level in levels:
                ctx.check_deadline(f"{level} iteration {it}")
                set_level(cluster, level)
                p.sql("DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history")
                p.sql("CHECKPOINT")
                started = time.time()
                a = lsn(p)
                t0 = time.monotonic()
                wl.init(p, ctx.bin_dir)
                init_s = time.monotonic() - t0
                b = lsn(p)
                init_stats = waldump_stats(p, a, b)
                p.sql("CHECKPOINT")
                c0 = lsn(p)
                n = int(params["oltp_transactions"])
                clients = int(params["clients"])
                res = run_pgbench(p, ctx.bin_dir, wl, clients, transactions=max(1, n // clients), log=False)
                c1 = lsn(p)
                oltp_stats = waldump_stats(p, c0, c1)
                m = {"init_wal_bytes": diff(p, a, b), "init_s": init_s, "oltp_wal_bytes": diff(p, c0, c1),
                     "oltp_transactions": res.get("transactions"), "tps": res.get("tps"),
                     "init_fpi_bytes": (init_stats.get("total") or {}).get("fpi"),
                     "oltp_fpi_bytes": (oltp_stats.get("total") or {}).get("fpi"),
                     "init_waldump": init_stats, "oltp_waldump": oltp_stats}
                if m["oltp_transactions"]:
                    m["oltp_wal_bytes_per_txn"] = m["oltp_wal_bytes"] / m["oltp_transactions"]
                rec = {"scenario": NAME, "run_id": ctx.run_id, "group": "wal_level", "variant": level,
                       "iteration": it, "started_at": started,
                       "variant_config": {"name": level, "settings": {"wal_level": level},
                                          "workload": wl.describe(), "clients": clients},
                       "method": {"iterations": iters}, "metrics": m, **common}
                ctx.store.append(rec)
                records.append(rec)
                if ctx.progress:
                    ctx.progress(f"{level} #{it + 1}: init {m['init_wal_bytes'] / 1e6:.1f} MB, "
                                 f"oltp {m['oltp_wal_bytes'] / 1e6:.1f} MB")
    return records
