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
(e.g. remote_receive) join automatically.  --set workload=simple-update runs
pgbench -N.  --set unflushed=off,on adds 'LEVEL+uw' variants of the levels
that wait for the standby, with the primary's stream_unflushed_wal =
written (patch 0010); the standby then accepts unflushed WAL in every
variant, so the pairs differ only in the primary's setting."""
from __future__ import annotations

from .. import topology
from ..method import Variant
from ..util import LabError
from ..workloads import WORKLOADS, tpcb
from . import Context, as_list, level_gucs, method_conf, sync_levels
from .large_txn import unflushed_modes

NAME = "sync-modes"
# levels that do not wait for the standby: the flush worker cannot matter
LOCAL_LEVELS = ("off", "local", "local_non_durable_reads")
PROFILES = {
    "lan-fast": {"net": "lan", "primary_disk": "nvme", "standby_disk": "nvme"},
    "lan-slow-standby": {"net": "lan", "primary_disk": "nvme", "standby_disk": "slow-write"},
    "wan20": {"net": "wan20", "primary_disk": "nvme", "standby_disk": "nvme"},
}
DEFAULTS = {"levels": "auto", "profiles": list(PROFILES), "workload": "tpcb", "scale": 10, "clients": 4,
            "flush_worker": "auto", "unflushed": "off",
            "iterations": 10, "duration": 30, "warmup": 5, "settle": 10}
SMOKE = {"profiles": ["lan-fast"], "scale": 1, "clients": 2, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


EXISTING = "existing"  # the one profile of a user's cluster (--cluster): no emulation


def run(ctx: Context, params: dict) -> list[dict]:
    existing = ctx.extra.get("cluster")  # external.ClusterConf
    # custom_profiles: {"name": {"net": ..., "primary_disk": ..., "standby_disk": ...}}
    known = {EXISTING: {}} if existing else dict(PROFILES)
    for name, env in (params.get("custom_profiles") or {}).items():
        known[name] = {"net": "none", "primary_disk": "nvme", "standby_disk": "nvme", **env}
    profiles = [EXISTING] if existing else as_list(params["profiles"])
    for p in profiles:
        if p not in known:
            raise LabError(f"unknown profile {p!r} (known: {', '.join(known)}; add custom_profiles)")
    first = known[profiles[0]]
    # reply_events: the standby's wal_receiver_reply_events on servers that
    # have it (default 'receive, flush'; 'receive, write, flush' lets
    # remote_write commits return after the write, not after the flush)
    settings = {}
    uw_modes = unflushed_modes(ctx.bin_dir, params.get("unflushed", "off"))
    if "written" in uw_modes:
        if existing:
            raise LabError("unflushed variants need a lab-made cluster (the standby must accept unflushed WAL)")
        settings["wal_receiver_accept_unflushed"] = "on"
    if params.get("reply_events") and topology.version_settings(ctx.bin_dir):
        settings["wal_receiver_reply_events"] = ", ".join(as_list(params["reply_events"]))
    if existing:
        from ..external import ExternalCluster

        cluster_cm = ExternalCluster(existing, ctx.log)
    else:
        spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk=first["primary_disk"], settings=settings,
                                    standbys=[topology.StandbySpec("s1", sync=True, disk=first["standby_disk"],
                                                                   net=first["net"])])
        cluster_cm = topology.Cluster(spec)
    if params.get("workload", "tpcb") == "tpcb":
        wl = tpcb(scale=int(params["scale"]))
    elif params["workload"] == "simple-update":
        wl = tpcb(scale=int(params["scale"]), skip_some=True)
    elif params["workload"] in WORKLOADS:
        wl = WORKLOADS[params["workload"]]()
    else:
        raise LabError(f"unknown workload {params['workload']!r} (known: {', '.join(WORKLOADS)})")
    conf = method_conf(params)
    with cluster_cm as cluster:
        available = sync_levels(cluster.primary)
        auto = available
        if existing:
            # "auto" leaves out the levels that need a setting the cluster
            # file does not let us change (local_non_durable_reads needs
            # commit_early_release); asked for by name, they are refused
            auto = [lvl for lvl in available if set(level_gucs(lvl)) <= set(existing.may_change)]
        levels = auto if params["levels"] == "auto" else as_list(params["levels"])
        missing = [lvl for lvl in levels if lvl not in available]
        if missing:
            raise LabError(f"the server has no synchronous_commit level {', '.join(missing)} "
                           f"(it has {', '.join(available)})")
        # flush_worker: the standby's wal_receiver_flush_worker (patched server only)
        has_fw = cluster.standbys[0].scalar(
            "SELECT count(*) FROM pg_settings WHERE name = 'wal_receiver_flush_worker'") == 1
        standby_extra = {}
        fw_param = params.get("flush_worker", "auto")
        if existing and fw_param == "auto" and "wal_receiver_flush_worker" not in existing.may_change:
            # a user's standby keeps its own flush worker setting (recorded in the proof)
            has_fw = False
        has_replies = cluster.standbys[0].scalar(
            "SELECT count(*) FROM pg_settings WHERE name = 'wal_receiver_reply_events'") == 1
        if existing and has_replies and "wal_receiver_reply_events" in existing.may_change:
            # what a lab-made standby gets at initdb, a user's by ALTER SYSTEM
            standby_extra = {"wal_receiver_reply_events": ", ".join(as_list(params.get("reply_events")
                                                                            or ["receive", "flush"]))}
        elif existing and "remote_receive" in levels:
            ctx.log("note: the standby keeps its own wal_receiver_reply_events; a primary with patch 0007 "
                    "asks a synchronous standby for early receipt anyway, an older one does not, and then "
                    "remote_receive waits like remote_write unless 'receive' is listed "
                    "(allow the setting in may_change to set it)")
        fws = (["off", "on"] if has_fw else ["off"]) if fw_param == "auto" else as_list(fw_param)
        if not has_fw and fw_param != "auto" and fws != ["off"]:
            raise LabError("this server has no wal_receiver_flush_worker")
        # interleave_profiles: one group, so environments alternate run by run
        # (each switch restarts the standby/proxy); default: one group per profile
        one_group = bool(params.get("interleave_profiles"))

        def env(prof, fw):
            standby = dict(standby_extra)
            if has_fw:
                standby["wal_receiver_flush_worker"] = fw
            return {**known[prof], "standby_settings": standby} if standby else known[prof]

        def vname(prof, lvl, fw, uw):
            name = lvl + ("+fw" if fw == "on" and lvl not in LOCAL_LEVELS else "")
            name += "+uw" if uw == "written" else ""
            return f"{prof}/{name}" if one_group else name

        def level_settings(lvl, uw):
            s = dict(gucs[lvl])
            if "written" in uw_modes:
                s["stream_unflushed_wal"] = uw
            return s
        # Settings per level; a setting that one level needs (an alias's
        # commit_early_release) is set to off explicitly by the others, so
        # that ALTER SYSTEM from one variant never leaks into the next.
        gucs = {lvl: level_gucs(lvl) for lvl in levels}
        for g in {g for s in gucs.values() for g in s}:
            for s in gucs.values():
                s.setdefault(g, "off")
        # A level that does not wait for the standby runs once, whatever
        # flush_worker lists (the standby's flush path does not affect it).
        # Unflushed sending, too, matters only to levels that wait for the standby.
        variants = [Variant(vname(prof, lvl, fw, uw), "all profiles" if one_group else prof, wl,
                            int(params["clients"]), level_settings(lvl, uw), env(prof, fw),
                            {"level": lvl, "profile": prof, "flush_worker": fw, "unflushed": uw})
                    for prof in profiles for lvl in levels for fw in fws for uw in uw_modes
                    if (fw == fws[0] and uw == uw_modes[0]) or lvl not in LOCAL_LEVELS]
        ctx.log(f"{NAME}: levels {levels}, profiles {profiles}, server {cluster.server_version()}")
        topo = (f"existing cluster: primary + {', '.join(s.name for s in cluster.standbys)}" if existing
                else "primary + 1 sync standby")
        return ctx.run_variants(cluster, NAME, variants, conf, wl, topo, params)
