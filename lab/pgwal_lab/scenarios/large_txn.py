"""large-txn: big transactions (default 80 rows x 8000 bytes into one of 32
tables) from 32 clients over a ~20 ms RTT link to a synchronous standby at
remote_write: TPS, latency, WAL per transaction and WAL the walsender had to
read back from disk (pg_stat_io, PostgreSQL 18+)."""
from __future__ import annotations

from .. import topology
from ..method import Variant
from ..workloads import large_txn
from . import Context, as_list, method_conf

NAME = "large-txn"
DEFAULTS = {"levels": ["remote_write"], "net": "wan20", "clients": 32, "rows": 80, "row_bytes": 8000,
            "tables": 32, "iterations": 10, "duration": 30, "warmup": 5, "settle": 10, "reset_data": True}
SMOKE = {"net": "lan", "clients": 4, "rows": 10, "tables": 4, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


def run(ctx: Context, params: dict) -> list[dict]:
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk="nvme",
                                standbys=[topology.StandbySpec("s1", sync=True, disk="nvme", net=params["net"])])
    wl = large_txn(int(params["rows"]), int(params["row_bytes"]), int(params["tables"]))
    conf = method_conf(params)
    with topology.Cluster(spec) as cluster:
        variants = [Variant(lvl, f"{params['net']}, {params['clients']} clients", wl, int(params["clients"]),
                            {"synchronous_commit": lvl}, {"net": params["net"]}, {"level": lvl})
                    for lvl in as_list(params["levels"])]
        return ctx.run_variants(cluster, NAME, variants, conf, wl, "primary + 1 sync standby", params)
