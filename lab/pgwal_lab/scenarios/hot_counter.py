"""hot-counter: one-row counter UPDATE on a primary alone, for several
client counts and primary WAL fsync latencies (shim on pg_wal only),
comparing synchronous_commit 'on' vs 'off' (and local_non_durable_reads
when the server has it).  One group per (fsync, clients)."""
from __future__ import annotations

from .. import topology
from ..method import Variant, run_groups
from ..workloads import hot_counter
from . import Context, as_list, method_conf, sync_levels

NAME = "hot-counter"
DEFAULTS = {"clients": [1, 8, 32, 64, 128], "fsync_ms": [0.2, 1, 10], "levels": "auto",
            "iterations": 10, "duration": 20, "warmup": 3, "settle": 5}
SMOKE = {"clients": [4], "fsync_ms": [1], "iterations": 1, "duration": 1, "warmup": 0, "settle": 0}


def disk_for(fsync_ms: float) -> str:
    return f"fsync={int(round(float(fsync_ms) * 1000))},match=pg_wal"


def run(ctx: Context, params: dict) -> list[dict]:
    fs = [float(x) for x in as_list(params["fsync_ms"])]
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk=disk_for(fs[0]))
    wl = hot_counter()
    conf = method_conf(params)
    with topology.Cluster(spec) as cluster:
        if params["levels"] == "auto":
            avail = sync_levels(cluster.primary)
            levels = ["on", "off"] + [l for l in ("local_non_durable_reads",) if l in avail]
        else:
            levels = as_list(params["levels"])
        variants = [Variant(lvl, f"fsync {f:g} ms, {c} clients", wl, int(c), {"synchronous_commit": lvl},
                            {"primary_disk": disk_for(f)}, {"level": lvl, "fsync_ms": f, "clients": int(c)})
                    for f in fs for c in as_list(params["clients"]) for lvl in levels]
        if ctx.set_total:
            ctx.set_total(len(variants) * conf.iterations, conf)
        ctx.log(f"{NAME}: levels {levels}, fsync {fs} ms, clients {params['clients']}")
        wl.init(cluster.primary, ctx.bin_dir)
        common = dict(ctx.common, server_version=cluster.server_version(), topology="primary alone",
                      namespaces=cluster.use_ns, params=params)
        return run_groups(cluster, variants, conf, ctx.store, NAME, ctx.run_id, common, ctx.progress, ctx.deadline)
