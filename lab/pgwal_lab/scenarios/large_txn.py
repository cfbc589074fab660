"""large-txn: big transactions (default 80 rows x 8000 bytes into one of 32
tables) from 32 clients over a ~20 ms RTT link to a synchronous standby at
remote_write: TPS, latency, WAL per transaction and WAL the walsender had to
read back from disk (pg_stat_io, PostgreSQL 18+).

unflushed=off|on|off,on (default auto: off,on when the server has
stream_unflushed_wal, patch 0010): variants 'LEVEL' and 'LEVEL+uw', the
latter with the primary sending written WAL before its fsync; the standby
accepts it in both (wal_receiver_accept_unflushed = on), so the two differ
only in the primary's setting.  primary_disk: a disk profile or a custom
shim spec such as "fsync=2000,match=pg_wal" (the primary's WAL fsync cost).

commit_apart=true runs BEGIN, INSERT and COMMIT as separate statements and
times each (pgbench -r): the report then compares each variant's COMMIT
latency with the commit latency model (model.py; docs/design/lab.md), from
the proved fsync and round-trip times; with `local` among the levels it
also shows the model calibrated by local's measured COMMIT.  reply_events
sets the standby's wal_receiver_reply_events (default: the server's own,
'write, flush'; before 2026-11-28 the lab set 'receive, flush', which sends
no reply after the write, so remote_write then waited for the flush)."""
from __future__ import annotations

from .. import topology
from ..util import LabError
from ..method import Variant
from ..workloads import large_txn
from . import Context, as_bool, as_list, method_conf

NAME = "large-txn"
DEFAULTS = {"levels": ["remote_write"], "net": "wan20", "clients": 32, "rows": 80, "row_bytes": 8000,
            "tables": 32, "iterations": 10, "duration": 30, "warmup": 5, "settle": 10, "reset_data": True,
            "unflushed": "auto", "primary_disk": "nvme", "commit_apart": False, "reply_events": None}
SMOKE = {"net": "lan", "clients": 4, "rows": 10, "tables": 4, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


def unflushed_modes(bin_dir, param) -> list[str]:
    """The primary's stream_unflushed_wal values to run ('off', 'written')."""
    has_uw = "stream_unflushed_wal" in topology.server_settings_sample(bin_dir)
    if param == "auto":
        return ["off", "written"] if has_uw else ["off"]
    modes = ["written" if m == "on" else m for m in as_list(param)]
    if not has_uw and modes != ["off"]:
        raise LabError("this server has no stream_unflushed_wal (patch 0010)")
    return modes


def run(ctx: Context, params: dict) -> list[dict]:
    modes = unflushed_modes(ctx.bin_dir, params.get("unflushed", "auto"))
    if isinstance(params.get("primary_disk"), list):  # a custom spec, split at its commas by --set
        params["primary_disk"] = ",".join(params["primary_disk"])
    extra = {"wal_receiver_accept_unflushed": "on"} if "written" in modes else {}
    if params.get("reply_events"):
        if not topology.knows_setting(ctx.bin_dir, "wal_receiver_reply_events"):
            raise LabError("this server has no wal_receiver_reply_events (patch 0002)")
        extra["wal_receiver_reply_events"] = ", ".join(as_list(params["reply_events"]))
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk=params.get("primary_disk", "nvme"),
                                standbys=[topology.StandbySpec("s1", sync=True, disk="nvme", net=params["net"])],
                                settings=extra)
    wl = large_txn(int(params["rows"]), int(params["row_bytes"]), int(params["tables"]),
                   commit_apart=as_bool(params.get("commit_apart", False), "commit_apart"))
    conf = method_conf(params)
    group = f"{params['net']}, {params['clients']} clients, primary disk {params.get('primary_disk', 'nvme')}"
    with topology.Cluster(spec) as cluster:
        variants = []
        for lvl in as_list(params["levels"]):
            for mode in modes:
                settings = {"synchronous_commit": lvl}
                if extra:
                    settings["stream_unflushed_wal"] = mode
                variants.append(Variant(lvl + ("+uw" if mode == "written" else ""), group, wl,
                                        int(params["clients"]), settings, {"net": params["net"]},
                                        {"level": lvl, "unflushed": mode}))
        return ctx.run_variants(cluster, NAME, variants, conf, wl, "primary + 1 sync standby", params)
