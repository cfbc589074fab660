"""large-txn: big transactions (default 80 rows x 8000 bytes into one of 32
tables) from 32 clients over a ~20 ms RTT link to a synchronous standby at
remote_write: TPS, latency, WAL per transaction and WAL the walsender had to
read back from disk (pg_stat_io, PostgreSQL 18+).

unflushed=off|on|off,on (default auto: off,on when the server has
stream_unflushed_wal, patch 0008): variants 'LEVEL' and 'LEVEL+uw', the
latter with the primary sending written WAL before its fsync; the standby
accepts it in both (wal_receiver_accept_unflushed = on), so the two differ
only in the primary's setting.  primary_disk: a disk profile or a custom
shim spec such as "fsync=2000,match=pg_wal" (the primary's WAL fsync cost).
disk_mb: the size of each node's emulated disk (default 3072); the defaults
write a few hundred MB per run, but rows that TOAST cannot compress (to fill
the WAL buffers) write GBs, and a full pg_wal stops the primary.

commit_apart=true runs BEGIN, INSERT and COMMIT as separate statements and
times each (pgbench -r): the report then compares each variant's COMMIT
latency with the commit latency model (model.py; docs/design/unflushed-wal.md), from
the proved fsync and round-trip times; with `local` among the levels it
also shows the model calibrated by local's measured COMMIT.  reply_events
sets the standby's wal_receiver_reply_events (default: the server's own,
'write, flush'; before 2026-11-28 the lab set 'receive, flush', which sends
no reply after the write, so remote_write then waited for the flush).

--set baseline=stock adds the levels in baseline_levels (default
remote_write) on the unpatched build of the same source (sync-modes
explains the baseline); the patched standby then gets
wal_receiver_accept_unflushed by ALTER SYSTEM in the patched variants only.

--set compare_bin=DIR runs every patched variant on a second patched build
too, interleaved (server/pg build --flavour bench --upto NNNN builds the
series up to the patch before the one measured); each variant's name starts
with the last patch of its build, e.g. '0010:remote_write+uw'.  Not with a
baseline."""
from __future__ import annotations

from .. import topology
from ..util import LabError
from ..method import Variant
from ..workloads import large_txn
from . import Context, as_bool, as_list, baseline_build, baseline_levels, compare_build, method_conf, series_label

NAME = "large-txn"
DEFAULTS = {"levels": ["remote_write"], "net": "wan20", "clients": 32, "rows": 80, "row_bytes": 8000,
            "tables": 32, "iterations": 10, "duration": 30, "warmup": 5, "settle": 10, "reset_data": True,
            "unflushed": "auto", "primary_disk": "nvme", "commit_apart": False, "reply_events": None,
            "disk_mb": None}
SMOKE = {"net": "lan", "clients": 4, "rows": 10, "tables": 4, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


def unflushed_modes(bin_dir, param) -> list[str]:
    """The primary's stream_unflushed_wal values to run ('off', 'written')."""
    has_uw = "stream_unflushed_wal" in topology.server_settings_sample(bin_dir)
    if param == "auto":
        return ["off", "written"] if has_uw else ["off"]
    modes = ["written" if m == "on" else m for m in as_list(param)]
    if not has_uw and modes != ["off"]:
        raise LabError("this server has no stream_unflushed_wal (patch 0008)")
    return modes


def run(ctx: Context, params: dict) -> list[dict]:
    modes = unflushed_modes(ctx.bin_dir, params.get("unflushed", "auto"))
    if isinstance(params.get("primary_disk"), list):  # a custom spec, split at its commas by --set
        params["primary_disk"] = ",".join(params["primary_disk"])
    baseline = baseline_build(params, None)
    compare = compare_build(params, ctx.bin_dir, None)
    if compare and baseline:
        raise LabError("compare_bin and baseline=stock together: run one comparison at a time")
    accept = {"wal_receiver_accept_unflushed": "on"} if "written" in modes else {}
    # without a baseline in every node's configuration; with one only in
    # the patched variants (the stock build does not know the setting)
    extra = {} if baseline else dict(accept)
    if params.get("reply_events"):
        if not topology.knows_setting(ctx.bin_dir, "wal_receiver_reply_events"):
            raise LabError("this server has no wal_receiver_reply_events (patch 0003)")
        if baseline:
            raise LabError("reply_events with a baseline: the stock build has no such setting")
        extra["wal_receiver_reply_events"] = ", ".join(as_list(params["reply_events"]))
    spec = topology.ClusterSpec(bin_dir=baseline or ctx.bin_dir, primary_disk=params.get("primary_disk", "nvme"),
                                standbys=[topology.StandbySpec("s1", sync=True, disk="nvme", net=params["net"])],
                                settings=extra)
    if params.get("disk_mb"):
        spec.disk_mb = int(params["disk_mb"])
    wl = large_txn(int(params["rows"]), int(params["row_bytes"]), int(params["tables"]),
                   commit_apart=as_bool(params.get("commit_apart", False), "commit_apart"))
    conf = method_conf(params)
    group = f"{params['net']}, {params['clients']} clients, primary disk {params.get('primary_disk', 'nvme')}"
    with topology.Cluster(spec) as cluster:
        variants = []
        if baseline:
            for lvl in baseline_levels(params, "remote_write"):
                variants.append(Variant(f"stock:{lvl}", group, wl, int(params["clients"]),
                                        {"synchronous_commit": lvl}, {"net": params["net"], "build": str(baseline)},
                                        {"level": lvl, "unflushed": "flushed", "build": "stock"}))
        env = {"net": params["net"]}
        if baseline:
            env["build"] = str(ctx.bin_dir)
            if accept:
                env["standby_settings"] = accept
        builds = [(None, ctx.bin_dir)]
        if compare:
            builds = [(series_label(compare), compare), (series_label(ctx.bin_dir), ctx.bin_dir)]
        for lvl in as_list(params["levels"]):
            for mode in modes:
                settings = {"synchronous_commit": lvl}
                if accept:
                    settings["stream_unflushed_wal"] = mode
                name = lvl + ("+uw" if mode == "written" else "")
                for label, bin_dir in builds:
                    build_env = dict(env)
                    meta = {"level": lvl, "unflushed": mode, **({"build": "pgwal"} if baseline else {})}
                    if label:
                        build_env["build"], meta["build"] = str(bin_dir), label
                    variants.append(Variant(f"{label}:{name}" if label else f"pgwal:{name}" if baseline else name,
                                            group, wl, int(params["clients"]), settings, build_env, meta))
        return ctx.run_variants(cluster, NAME, variants, conf, wl, "primary + 1 sync standby", params)
