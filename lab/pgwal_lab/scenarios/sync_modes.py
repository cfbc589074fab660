"""sync-modes: every synchronous_commit level the server accepts, on a
primary + 1 synchronous standby, TPC-B (or --set workload=insert|hot-counter|large-txn),
across three environments:
  lan-fast          LAN link (0.05 ms one way), nvme disks everywhere
  lan-slow-standby  LAN link, standby disk 'slow-write' (+2 ms fsync, +0.3 ms pwrite)
  wan20             ~20 ms RTT link (10 ms each way), nvme disks
On the patched server the standby's wal_receiver_reply_events defaults to
'receive, flush' (--set reply_events=receive,write,flush to change it), and
each level runs with the standby's wal_receiver_flush_worker off and on
(variant names 'LEVEL' and 'LEVEL+fw'; --set flush_worker=off|on|off,on).
Levels are discovered from pg_settings, so a patched server's new levels
(e.g. remote_receive) join automatically."""
from __future__ import annotations

from .. import topology
from ..method import Variant
from ..util import LabError
from ..workloads import WORKLOADS, tpcb
from . import Context, as_list, method_conf, sync_levels

NAME = "sync-modes"
# levels that do not wait for the standby: the flush worker cannot matter
LOCAL_LEVELS = ("off", "local", "local_non_durable_reads")
PROFILES = {
    "lan-fast": {"net": "lan", "primary_disk": "nvme", "standby_disk": "nvme"},
    "lan-slow-standby": {"net": "lan", "primary_disk": "nvme", "standby_disk": "slow-write"},
    "wan20": {"net": "wan20", "primary_disk": "nvme", "standby_disk": "nvme"},
}
DEFAULTS = {"levels": "auto", "profiles": list(PROFILES), "workload": "tpcb", "scale": 10, "clients": 4,
            "flush_worker": "auto",
            "iterations": 10, "duration": 30, "warmup": 5, "settle": 10}
SMOKE = {"profiles": ["lan-fast"], "scale": 1, "clients": 2, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


def run(ctx: Context, params: dict) -> list[dict]:
    # custom_profiles: {"name": {"net": ..., "primary_disk": ..., "standby_disk": ...}}
    known = dict(PROFILES)
    for name, env in (params.get("custom_profiles") or {}).items():
        known[name] = {"net": "none", "primary_disk": "nvme", "standby_disk": "nvme", **env}
    profiles = as_list(params["profiles"])
    for p in profiles:
        if p not in known:
            raise LabError(f"unknown profile {p!r} (known: {', '.join(known)}; add custom_profiles)")
    first = known[profiles[0]]
    # reply_events: the standby's wal_receiver_reply_events on servers that
    # have it (default 'receive, flush'; 'receive, write, flush' lets
    # remote_write commits return after the write, not after the flush)
    settings = {}
    if params.get("reply_events") and topology.version_settings(ctx.bin_dir):
        settings["wal_receiver_reply_events"] = ", ".join(as_list(params["reply_events"]))
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk=first["primary_disk"], settings=settings,
                                standbys=[topology.StandbySpec("s1", sync=True, disk=first["standby_disk"],
                                                               net=first["net"])])
    if params.get("workload", "tpcb") == "tpcb":
        wl = tpcb(scale=int(params["scale"]))
    elif params["workload"] in WORKLOADS:
        wl = WORKLOADS[params["workload"]]()
    else:
        raise LabError(f"unknown workload {params['workload']!r} (known: {', '.join(WORKLOADS)})")
    conf = method_conf(params)
    with topology.Cluster(spec) as cluster:
        levels = sync_levels(cluster.primary) if params["levels"] == "auto" else as_list(params["levels"])
        # flush_worker: the standby's wal_receiver_flush_worker (patched server only)
        has_fw = cluster.standbys[0].scalar(
            "SELECT count(*) FROM pg_settings WHERE name = 'wal_receiver_flush_worker'") == 1
        fw_param = params.get("flush_worker", "auto")
        fws = (["off", "on"] if has_fw else ["off"]) if fw_param == "auto" else as_list(fw_param)
        if not has_fw and fws != ["off"]:
            raise LabError("this server has no wal_receiver_flush_worker")
        # interleave_profiles: one group, so environments alternate run by run
        # (each switch restarts the standby/proxy); default: one group per profile
        one_group = bool(params.get("interleave_profiles"))
        def env(prof, fw):
            return {**known[prof], "standby_settings": {"wal_receiver_flush_worker": fw}} if has_fw else known[prof]

        def vname(prof, lvl, fw):
            name = lvl + ("+fw" if fw == "on" and lvl not in LOCAL_LEVELS else "")
            return f"{prof}/{name}" if one_group else name
        # A level that does not wait for the standby runs once, whatever
        # flush_worker lists (the standby's flush path does not affect it).
        variants = [Variant(vname(prof, lvl, fw), "all profiles" if one_group else prof, wl, int(params["clients"]),
                            {"synchronous_commit": lvl}, env(prof, fw),
                            {"level": lvl, "profile": prof, "flush_worker": fw})
                    for prof in profiles for lvl in levels for fw in fws
                    if fw == fws[0] or lvl not in LOCAL_LEVELS]
        ctx.log(f"{NAME}: levels {levels}, profiles {profiles}, server {cluster.server_version()}")
        return ctx.run_variants(cluster, NAME, variants, conf, wl, "primary + 1 sync standby", params)
