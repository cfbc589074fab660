"""audit: what each acknowledgement survives, counted in crash loops.

A primary and one synchronous standby, both with a volatile page cache
(power.py: an emulated OS crash loses what was not fsynced).  Each cycle
picks the next (fault, level) in turn, runs the ledger workload
(audit/ledger.py) at that level for a random time between `load_s` bounds,
injects the fault (audit/faults.py), recovers, and checks the recovered
node(s) against the ledger (audit/check.py).  Failover cycles promote the
standby, check it, then rewind the old primary, start it as the new
primary's synchronous standby, and check it too, so the nodes swap roles.

The standby streams through a delay proxy (`net`, default 1 ms each way),
which dies with the primary in failover faults: WAL in flight is lost as
with a machine that lost power (a killed process's socket would still
deliver its send buffer).  Every other failover cycle first stalls the
link (the proxy frozen) for a random time up to `stall_ms` and crashes the
primary inside the stall: commits a level acknowledges without the standby
are then certainly beyond what the standby has.

Each node's WAL fsync takes `wal_fsync_ms` more (the shim, pg_wal only).

Random crash moments rarely land in the narrow windows the docs name, so
three faults choose their moment (a random length within the bounds):
`partition` cuts the link for `cut_ms` (the proxy dies: both connections
reset, reconnects refused), heals it, lets the standby reconnect and
stream on under load, then fails over.  `held-power` holds the primary's
WAL fsyncs for `hold_ms` (the shim's hold file: what XLogWrite wrote sits
in the page cache, unflushed) and then cuts its power: every commit
released early in that time was visible and is lost, and every other
level must have shown nothing of it.  `held-failover-both` holds the
standby's WAL fsyncs and then cuts power on both: what a flush worker's
walreceiver acknowledged meanwhile (received, written) is lost, what `on`
acknowledges is not.  Without a flush worker the walreceiver itself waits
in the held fsync and receives nothing more, so the window there is the
batch it last wrote (seen: often nothing acknowledged in it).

`server_settings` (a JSON object) adds settings to both nodes: the tests
use {"fsync": "off"} to break the promises on purpose.

Levels: `auto` is every level the server has (sync_levels), plus
`remote_receive+flush_worker` (the standby's wal_receiver_flush_worker on)
where the server has it.  Faults: check.FAULTS.
Before the first cycle each node shows its volatile page cache in effect
(power.self_test as the server user, and the shim mapped in the
postmaster with the node's undo log directory); the run stops otherwise.
A cycle where a session failed before the fault is void and stored as such.
"""
from __future__ import annotations

import random
import shutil
import time

from .. import netem, topology
from ..audit import check, faults
from ..audit.ledger import READER_KINDS, Load, prepare_cycle
from ..proof import ProofError, prove_disk, prove_link, read_build_info, shim_state
from ..util import LabError, wait_for
from . import Context, as_list, sync_levels

NAME = "audit"
DEFAULTS = {"levels": "auto", "faults": list(check.FAULTS), "cycles": 100, "load_s": [0.3, 1.5],
            "net": "1ms", "stall_ms": [0, 300], "cut_ms": [100, 1000],
            "hold_ms": [50, 300], "wal_fsync_ms": 1, "seed": 1, "server_settings": {}}
SMOKE = {"cycles": 1, "load_s": [0.2, 0.5]}

SETTINGS = {
    "wal_log_hints": "on",              # pg_rewind
    "max_prepared_transactions": 20,
    "shared_buffers": "128MB",
    # checkpoints during the cycles: with completion target 0.9 one starts
    # every ~67MB of WAL
    "max_wal_size": "128MB",
    "min_wal_size": "64MB",
    "checkpoint_timeout": "30s",
    # pg_rewind reads the old primary's WAL from the last common checkpoint
    # record to its end, up to about two checkpoint intervals plus the lost
    # tail; its crash recovery's own checkpoint would recycle whatever
    # wal_keep_size does not hold (run 5 failed so with max_wal_size 256MB
    # and 128MB kept: the divergence was 140MB past the checkpoint).  Kept
    # segments are kept by number whatever their timeline, so every cycle
    # starts a segment of its own (pg_switch_wal) and old timelines' segments
    # leave the window (with 256MB kept and no switch, pg_wal grew by ~2
    # segments per failover until the disk was full, cycle 67)
    "wal_keep_size": "256MB",
    "synchronous_commit": "local",      # the workload sets its level per session
    "log_min_messages": "warning",
    "wal_retrieve_retry_interval": "100ms",  # a standby reconnects soon after its primary restarted
}


def _has_setting(node, name: str) -> bool:
    return node.scalar("SELECT count(*) FROM pg_settings WHERE name = %s", (name,)) == 1


def resolve_levels(params: dict, primary) -> list[str]:
    if params["levels"] != "auto":
        return [str(x) for x in as_list(params["levels"])]
    levels = sync_levels(primary)
    if _has_setting(primary, "wal_receiver_flush_worker") and "remote_receive" in levels:
        levels.insert(levels.index("remote_receive") + 1, "remote_receive+flush_worker")
    if _has_setting(primary, "stream_unflushed_wal"):
        for lvl in ("remote_write", "on"):
            levels.insert(levels.index(lvl) + 1, f"{lvl}+uw")
    return levels


def session_settings(level: str, primary) -> dict:
    s = {"synchronous_commit": check.base_level(level)}
    if _has_setting(primary, "commit_early_release"):
        s["commit_early_release"] = "on" if check.early_release(level) else "off"
    elif check.early_release(level):
        raise LabError(f"level {level}: the server has no commit_early_release")
    return s


def _modifier_setting(level: str, node, modifier: str, guc: str, on: str, off: str) -> dict:
    """The setting a level modifier turns on (and every other level off),
    where the server has it; a modifier the server lacks is an error."""
    if _has_setting(node, guc):
        return {guc: on if modifier in level else off}
    if modifier in level:
        raise LabError(f"level {level}: the server has no {guc}")
    return {}


def primary_settings(level: str, primary) -> dict:
    """+uw: the primary streams WAL before flushing it (patch 0008)."""
    return _modifier_setting(level, primary, "+uw", "stream_unflushed_wal", "written", "off")


def standby_settings(level: str, standby) -> dict:
    """+flush_worker: the standby's walreceiver hands its fsyncs to a worker (0005)."""
    return _modifier_setting(level, standby, "+flush_worker", "wal_receiver_flush_worker", "on", "off")


def apply_settings(node, settings: dict, timeout: float = 30) -> None:
    if not settings:
        return
    node.alter_system(settings)
    for k, v in settings.items():
        wait_for(lambda: node.scalar(f"SHOW {k}") == v, timeout, f"{node.name}: {k} = {v}")


def prove(cluster, bin_dir) -> dict:
    """Each node's volatile page cache is in effect (else ProofError)."""
    from .. import power

    out = {"build": read_build_info(bin_dir) or "stock",
           "link": {k: v for k, v in prove_link(standby_of(cluster)).items() if k != "proxy"},
           "wal_fsync_us": {n.name: (prove_disk(n).get("probe") or {}).get("fdatasync_us_min")
                            for n in cluster.nodes.values()}}
    for n in cluster.nodes.values():
        st = shim_state(n.pid())
        want = n.extra_env
        if want["LD_PRELOAD"] not in st["mapped"] or \
                st["env"].get("PGWAL_SHIM_VOLATILE_DIR") != want["PGWAL_SHIM_VOLATILE_DIR"]:
            raise ProofError(f"{n.name}: the postmaster has not loaded the shim in volatile mode "
                             f"(mapped {st['mapped']}, env {st['env']})")
        power.self_test(faults.volatile_dir(n), n.datadir,
                        lambda cmd, n=n: n.run_pg(cmd, timeout=60))
        out[n.name] = "volatile page cache proved (unsynced write lost, synced write kept)"
    return out


def standby_of(cluster):
    return next(n for n in cluster.nodes.values() if n is not cluster.primary)


def _cleanup_prepared(node, cycle: int) -> int:
    """Roll back the cycle's in-doubt prepared transactions (never acknowledged)."""
    with node.connect() as c:
        c.execute("SET synchronous_commit = local")
        gids = [g for (g,) in c.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                        (f"audit\\_{cycle}\\_%",))]
        for g in gids:
            c.execute(f"ROLLBACK PREPARED '{g}'")
    return len(gids)


def catch_up(cluster) -> None:
    """Wait until the standby replayed everything the primary inserted.
    pg_current_wal_lsn() is the write position: commits acknowledged with
    synchronous_commit = off can still be in WAL buffers beyond it, and a
    check against it found "missing" rows that were only on their way.  A
    commit flushed here first flushes them all, and gives the target a
    record to end on: right after pg_switch_wal() the insert position is
    the next segment's start, which no standby reaches until more WAL comes
    (measured on stock 15: every cycle waited ~15 s for a standby snapshot
    record)."""
    with cluster.primary.connect() as c:
        c.execute("SET synchronous_commit = local")
        c.execute("SELECT txid_current()")
        lsn = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    cluster.wait_replay(lsn=lsn)


def _follower_check(cluster, node, load: Load, label: str, serving, rec: dict) -> None:
    """Check a node that follows `serving` once it caught up.  One that
    cannot follow (it holds WAL the serving node lost) is a violation, and
    the cluster is then unfit for further cycles (rec["fatal"])."""
    try:
        cluster.wait_streaming(timeout=30)
        catch_up(cluster)
    except LabError as e:
        chk = check.NodeCheck(label)
        chk.follow_error = str(e).splitlines()[0][:200]
        rec["checks"].append(chk.asdict())
        rec["fatal"] = f"{label} could not follow: {chk.follow_error}"
        return
    rec["checks"].append(_check(node, load, label, serving=serving).asdict())


def _check(node, load: Load, label: str, serving=None) -> check.NodeCheck:
    """Check `node`; with `serving`, also compare its rows with that node's."""
    with node.connect() as c:
        chk = check.check_node(c, load, label, statuses=serving is None)
        if serving is not None:
            with serving.connect() as s:
                chk.diverged = len(check.cycle_rows(c, load.cycle) ^ check.cycle_rows(s, load.cycle))
        return chk


def run_cycle(cluster, cycle: int, level: str, fault: str, load_s: float, moment_ms: float,
              readers: list[str]) -> dict:
    """One cycle.  `moment_ms`: how long the link stalls before a failover
    (0: no stall), is cut in a partition, or the WAL fsyncs are held."""
    primary = cluster.primary
    standby = standby_of(cluster)
    apply_settings(standby, standby_settings(level, standby))
    uw = primary_settings(level, primary)
    apply_settings(primary, uw)
    if uw:  # in effect: the walsender sends what the level says
        want = uw["stream_unflushed_wal"] if uw["stream_unflushed_wal"] != "off" else "flushed"
        wait_for(lambda: primary.scalar("SELECT send_mode FROM pg_stat_replication WHERE application_name = %s",
                                        (standby.name,)) == want, 30, f"send_mode {want}")
    with primary.connect() as c:
        prepare_cycle(c, cycle)
        c.execute("SELECT pg_switch_wal()")
    cluster.wait_streaming()
    catch_up(cluster)
    load = Load(primary.conninfo(), cycle, session_settings(level, primary), readers)
    load.start()
    time.sleep(load_s)
    kind = check.base_fault(fault)
    failover = kind.startswith("failover")
    pre: dict = {}
    if fault == "partition":
        pre["cut_ms"] = round(moment_ms, 1)
        faults.cut(standby)
        time.sleep(moment_ms / 1000)
        faults.heal(standby)
        t0 = time.monotonic()
        cluster.wait_streaming(timeout=30)
        pre["reconnect_s"] = round(time.monotonic() - t0, 3)
        time.sleep(load_s / 2)  # streaming again, under load, before the crash
    held = {"held-power": primary, "held-failover-both": standby}.get(fault)
    proxies = [standby.proxy.pid] if failover and standby.proxy else []
    try:
        if held is not None:
            pre["hold_ms"] = round(moment_ms, 1)
            faults.hold(held)
            time.sleep(moment_ms / 1000)
        elif fault in ("failover", "failover-both") and moment_ms > 0:
            pre["stall_ms"] = round(moment_ms, 1)
            faults.stall(standby.proxy.pid)
            time.sleep(moment_ms / 1000)
        crashed = {"failover-both": [primary, standby], "standby-power": [standby]}.get(kind, [primary])
        undone = faults.crash(crashed, power_loss=kind != "kill", proxies=proxies,
                              mark=lambda: setattr(load, "fault_at", time.monotonic()))
    finally:
        if held is not None:
            faults.release(held)
    # with the standby down, waiting commits wait: it comes back before the
    # sessions are asked to stop
    standby_back_s = faults.start(standby) if kind == "standby-power" else None
    load.finish()
    rec = {"cycle": cycle, "level": level, "fault": fault, "load_s": round(load_s, 3), "undone": undone, **pre,
           "writer_errors": [w.error for w in load.writers if w.error_before_fault],
           "reader_errors": [r.error for r in load.readers if r.error_before_fault],
           "acked_total": sum(len(w.acked) for w in load.writers), "checks": []}
    if rec["writer_errors"] or rec["reader_errors"]:
        rec["void"] = True
    if kind == "standby-power":
        rec["recovery_s"] = round(standby_back_s, 3)
        rec["checks"].append(_check(primary, load, "primary").asdict())
        rec["prepared_rolled_back"] = _cleanup_prepared(primary, cycle)
        _follower_check(cluster, standby, load, "standby", primary, rec)
    elif kind in ("kill", "power"):
        rec["recovery_s"] = round(faults.start(primary), 3)
        chk = _check(primary, load, "primary")
        rec["checks"].append(chk.asdict())
        rec["prepared_rolled_back"] = _cleanup_prepared(primary, cycle)
        # the standby follows the restarted primary (with unflushed WAL
        # streaming: onto its new timeline) and holds exactly its rows
        _follower_check(cluster, standby, load, "standby", primary, rec)
    else:
        t0 = time.monotonic()
        standby.stop_proxy()  # it died with the primary
        if kind == "failover-both":
            faults.start(standby)
        faults.promote(standby)
        rec["recovery_s"] = round(time.monotonic() - t0, 3)
        chk = _check(standby, load, "promoted")
        rec["checks"].append(chk.asdict())
        # the old primary rejoins as the new primary's synchronous standby
        old = primary
        rec["rewind"] = faults.rewind(old, standby)
        faults.make_standby_of(old, standby)
        old.net_profile, standby.net_profile = standby.net_profile, netem.profile("none")
        standby.upstream = None
        cluster.primary = standby
        standby.write_node_conf()  # synchronous_standby_names now names the old primary
        standby.sql("SELECT pg_reload_conf()")
        faults.arm(old)
        faults.start(old)
        rec["prepared_rolled_back"] = _cleanup_prepared(standby, cycle)
        _follower_check(cluster, old, load, "rejoined", standby, rec)
        if "fatal" not in rec:
            rec["link"] = prove_link(old).get("rtt_ms_min")
    rec["disk_used_mb"] = {n.name: round(shutil.disk_usage(n.root / "mnt").used / 1048576)
                           for n in cluster.nodes.values()}
    for c in rec["checks"]:
        c["violations"] = check.violations(level, fault, check.NodeCheck(**{
            k: v for k, v in c.items() if k != "violations"}))
    return rec


def run(ctx: Context, params: dict) -> list[dict]:
    fault_list = [str(f) for f in as_list(params["faults"])]
    for f in fault_list:
        if f not in check.FAULTS:
            raise LabError(f"unknown fault {f!r} (known: {', '.join(check.FAULTS)})")
    lo, hi = (float(x) for x in as_list(params["load_s"]))
    cycles = int(params["cycles"])
    rng = random.Random(int(params["seed"]))
    bounds = {k: [float(x) for x in as_list(params[k])] for k in ("stall_ms", "cut_ms", "hold_ms")}
    disk = f"fsync={int(float(params['wal_fsync_ms']) * 1000)},match=pg_wal" if float(params["wal_fsync_ms"]) \
        else "tmpfs"
    settings = dict(SETTINGS)
    if "wal_receiver_accept_unflushed" in topology.server_settings_sample(ctx.bin_dir):
        settings["wal_receiver_accept_unflushed"] = "on"  # +uw levels differ on the primary alone
    settings.update(params["server_settings"] or {})
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, primary_disk=disk, settings=settings, namespaces=False,
                                standbys=[topology.StandbySpec("s1", sync=True, net=str(params["net"]), disk=disk)],
                                disk_mb=2048)
    faults.become_subreaper()  # before any postmaster starts: see crash()
    cluster = topology.Cluster(spec)
    for n in cluster.nodes.values():
        faults.arm(n)
    records = []
    with cluster:
        proof = prove(cluster, ctx.bin_dir)
        levels = resolve_levels(params, cluster.primary)
        readers = [r for r in READER_KINDS if r != "durable" or _has_setting(cluster.primary, "durable_snapshots")]
        schedule = [(f, lvl) for _ in range(cycles) for f in fault_list for lvl in levels]
        ctx.log(f"audit: {len(levels)} levels x {len(fault_list)} faults x {cycles} cycles; levels {levels}; "
                f"readers {readers}")
        if ctx.set_total:
            ctx.set_total(len(schedule), None)
        common = dict(ctx.common, server_version=cluster.server_version(), proof=proof, params=params)
        for i, (fault, level) in enumerate(schedule):
            if ctx.deadline and time.monotonic() > ctx.deadline - 30:
                # rounds cover every cell alike, so a run cut short by its
                # time limit is a smaller sample, not a biased one; more
                # runs (other seeds) add to it in one report
                ctx.log(f"audit: time limit reached after {i} of {len(schedule)} cycles "
                        f"({i // max(1, len(levels) * len(fault_list))} full rounds)")
                break
            load_s = rng.uniform(lo, hi)
            if fault.startswith("held-"):
                moment_ms = rng.uniform(*bounds["hold_ms"])
            elif fault == "partition":
                moment_ms = rng.uniform(*bounds["cut_ms"])
            elif (i // len(levels) // len(fault_list) + levels.index(level)) % 2:
                # half the failover cycles of each level stall, alternating per round
                moment_ms = rng.uniform(*bounds["stall_ms"]) if fault.startswith("failover") else 0.0
            else:
                moment_ms = 0.0
            try:
                rec = run_cycle(cluster, i + 1, level, fault, load_s, moment_ms, readers)
            except LabError as e:
                logs = "\n".join(f"--- {n.name} ({'primary' if n is cluster.primary else 'standby'}) log:\n"
                                 f"{n.log_tail(40)}" for n in cluster.nodes.values())
                raise LabError(f"cycle {i + 1} ({fault} at {level}): {e}\n{logs}") from None
            rec.update(common, scenario=NAME, group=fault, variant=level, run_id=ctx.run_id)
            ctx.store.append(rec)
            records.append(rec)
            if rec.get("fatal"):
                ctx.log(f"audit: cycle {i + 1} left the cluster unfit for more cycles: {rec['fatal']}")
                break
            bad = [v for c in rec["checks"] for v in c["violations"]]
            if ctx.progress:
                ctx.progress(f"cycle {i + 1}: {fault} at {level}: {rec['acked_total']} acked, "
                             + ", ".join(f"{c['node']} lost {c['acked_lost']}" for c in rec["checks"])
                             + (" VOID" if rec.get("void") else "")
                             + (f" VIOLATION: {bad}" if bad else ""))
    return records


def failures(records: list[dict]) -> str | None:
    """Why the run fails (`pgwal-lab run` exits 3): a promise broken, or a
    cycle void because a session failed before the fault."""
    bad = [f"cycle {r['cycle']} {r['fault']} at {r['level']} ({c['node']}): {'; '.join(c['violations'])}"
           for r in records if r.get("scenario") == NAME for c in r.get("checks", []) if c.get("violations")]
    void = [f"cycle {r['cycle']} {r['fault']} at {r['level']}: {r['writer_errors'] + r['reader_errors']}"
            for r in records if r.get("scenario") == NAME and r.get("void")]
    if not bad and not void:
        return None
    return "; ".join((bad + void)[:10]) + (f" (and {len(bad) + len(void) - 10} more)" if len(bad) + len(void) > 10
                                             else "")
