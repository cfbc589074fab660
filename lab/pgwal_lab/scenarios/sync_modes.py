"""sync-modes: every synchronous_commit level the server accepts, on a
primary + 1 synchronous standby, TPC-B (or --set workload=insert|hot-counter|large-txn),
across three environments:
  lan-fast          LAN link (0.05 ms one way), nvme disks everywhere
  lan-slow-standby  LAN link, standby disk 'slow-write' (+2 ms fsync, +0.3 ms pwrite)
  wan20             ~20 ms RTT link (10 ms each way), nvme disks
and, only when named in --set profiles:
  direct            nothing emulated: loopback, no disk latency added
Every server setting the lab does not need keeps the server's default; a
patched standby's wal_receiver_reply_events is 'write, flush' unless
--set reply_events=... says otherwise.  On the patched server each level
runs with the standby's wal_receiver_flush_worker off and on (variant names
'LEVEL' and 'LEVEL+fw'; --set flush_worker=off|on|off,on).
Levels are discovered from pg_settings, so a patched server's new levels
(e.g. remote_receive) join automatically.  --set workload=simple-update runs
pgbench -N.  --set unflushed=off,on adds 'LEVEL+uw' variants of the levels
that wait for the standby, with the primary's stream_unflushed_wal =
written (patch 0008); the standby then accepts unflushed WAL in every
variant, so the pairs differ only in the primary's setting.

--set baseline=stock measures against what a user runs today: the levels
in baseline_levels (default on,remote_write) on the unpatched build of the
same source built like the bench flavour (baseline_bin, default
.build/install/stock-bench/bin: server/pg build --flavour stock-bench),
interleaved with the patched build's levels in one group.  Variant names
then say the build ('stock:on', 'pgwal:remote_receive+fw'); both builds run
the same data directories (made by the stock build's initdb, as a
cluster pgwal's packages are installed over; the series changes no
catalog), restarted between builds and, with restart=true (the default with a baseline), before
every run, so no run inherits a walsender or shared memory from the one
before it."""
from __future__ import annotations

from .. import topology
from ..method import Variant
from ..util import LabError
from ..workloads import WORKLOADS, tpcb
from . import Context, as_list, baseline_build, baseline_levels, level_gucs, method_conf, sync_levels
from .large_txn import unflushed_modes

NAME = "sync-modes"
# levels that do not wait for the standby: the flush worker cannot matter
LOCAL_LEVELS = ("off", "local", "local_non_durable_reads")
PROFILES = {
    "lan-fast": {"net": "lan", "primary_disk": "nvme", "standby_disk": "nvme"},
    "lan-slow-standby": {"net": "lan", "primary_disk": "nvme", "standby_disk": "slow-write"},
    "wan20": {"net": "wan20", "primary_disk": "nvme", "standby_disk": "nvme"},
    # nothing emulated: loopback, no added disk latency (not in the default set)
    "direct": {"net": "none", "primary_disk": "tmpfs", "standby_disk": "tmpfs"},
}
DEFAULTS = {"levels": "auto", "profiles": ["lan-fast", "lan-slow-standby", "wan20"], "workload": "tpcb", "scale": 10, "clients": 4,
            "flush_worker": "auto", "unflushed": "off", "baseline": "none", "baseline_levels": "",
            "iterations": 10, "duration": 30, "warmup": 5, "settle": 10}
SMOKE = {"profiles": ["lan-fast"], "scale": 1, "clients": 2, "iterations": 1, "duration": 1, "warmup": 0,
         "settle": 0}


# the stock levels a baseline run measures against by default
STOCK_DEFAULT = "on,remote_write"
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
    # reply_events: the standby's wal_receiver_reply_events (patched servers;
    # unset, the server's default 'write, flush')
    settings = {}
    baseline = baseline_build(params, existing)
    uw_modes = unflushed_modes(ctx.bin_dir, params.get("unflushed", "off"))
    if "written" in uw_modes:
        if existing:
            raise LabError("unflushed variants need a lab-made cluster (the standby must accept unflushed WAL)")
        settings["wal_receiver_accept_unflushed"] = "on"
    if params.get("reply_events"):
        if not topology.knows_setting(ctx.bin_dir, "wal_receiver_reply_events"):
            raise LabError("this server has no wal_receiver_reply_events (patch 0003)")
        if baseline:
            raise LabError("reply_events with a baseline: the stock build has no such setting")
        settings["wal_receiver_reply_events"] = ", ".join(as_list(params["reply_events"]))
    if baseline and "written" in uw_modes:
        raise LabError("unflushed variants with a baseline: the standby's wal_receiver_accept_unflushed "
                       "would stop the stock build from starting (use large-txn)")
    if existing:
        from ..external import ExternalCluster

        cluster_cm = ExternalCluster(existing, ctx.log)
    else:
        # with a baseline the stock build makes the data directories: the
        # patched build runs them as it runs any stock 18 cluster it is
        # installed over, while the patched initdb's system views would not
        # work on stock binaries
        spec = topology.ClusterSpec(bin_dir=baseline or ctx.bin_dir, primary_disk=first["primary_disk"], settings=settings,
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
        if baseline:
            cluster.switch_build(ctx.bin_dir)  # the patched server's levels and settings
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
        if existing and has_replies and params.get("reply_events"):
            if "wal_receiver_reply_events" not in existing.may_change:
                raise LabError("reply_events: the cluster file does not allow changing wal_receiver_reply_events")
            # what a lab-made standby gets at initdb, a user's by ALTER SYSTEM
            standby_extra = {"wal_receiver_reply_events": ", ".join(as_list(params["reply_events"]))}
        fws = (["off", "on"] if has_fw else ["off"]) if fw_param == "auto" else as_list(fw_param)
        if not has_fw and fw_param != "auto" and fws != ["off"]:
            raise LabError("this server has no wal_receiver_flush_worker")
        # interleave_profiles: one group, so environments alternate run by run
        # (each switch restarts the standby/proxy); default: one group per profile
        one_group = bool(params.get("interleave_profiles"))

        def env(prof, fw, build=None):
            standby = dict(standby_extra)
            if has_fw and build != "stock":
                standby["wal_receiver_flush_worker"] = fw
            e = {**known[prof], "standby_settings": standby} if standby else dict(known[prof])
            if baseline:
                e["build"] = str(baseline if build == "stock" else ctx.bin_dir)
            return e

        def vname(prof, lvl, fw, uw, build=None):
            name = lvl + ("+fw" if fw == "on" and lvl not in LOCAL_LEVELS else "")
            name += "+uw" if uw == "written" else ""
            if baseline:
                name = f"{build}:{name}"
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
        variants = []
        for prof in profiles:
            group = "all profiles" if one_group else prof
            if baseline:
                # what the user runs today first: the report compares every
                # patched variant with each of these
                variants += [Variant(vname(prof, lvl, "off", "flushed", "stock"), group, wl, int(params["clients"]),
                                     {"synchronous_commit": lvl}, env(prof, "off", "stock"),
                                     {"level": lvl, "profile": prof, "build": "stock", "flush_worker": "off",
                                      "unflushed": "flushed"})
                             for lvl in baseline_levels(params, STOCK_DEFAULT)]
            variants += [Variant(vname(prof, lvl, fw, uw, "pgwal"), group, wl, int(params["clients"]),
                                 level_settings(lvl, uw), env(prof, fw, "pgwal"),
                                 {"level": lvl, "profile": prof, "flush_worker": fw, "unflushed": uw,
                                  **({"build": "pgwal"} if baseline else {})})
                         for lvl in levels for fw in fws for uw in uw_modes
                         if (fw == fws[0] and uw == uw_modes[0]) or lvl not in LOCAL_LEVELS]
        ctx.log(f"{NAME}: levels {levels}, profiles {profiles}, server {cluster.server_version()}"
                + (f"; baseline: {', '.join(baseline_levels(params, STOCK_DEFAULT))} on {baseline}" if baseline else ""))
        topo = (f"existing cluster: primary + {', '.join(s.name for s in cluster.standbys)}" if existing
                else "primary + 1 sync standby")
        return ctx.run_variants(cluster, NAME, variants, conf, wl, topo, params)

