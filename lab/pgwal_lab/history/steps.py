"""Carrying out one step of a history.

Every step runs the audit's ledger workload (writers of every kind and
readers, audit/ledger.py) on the primary at the step's level for load_ms.
A crash (schedule.CRASHES) or a partition strikes while it runs; any other
operation runs after it ended.  A crashed node is started again at once, so
that commits waiting for it can finish; a failover leaves the old primary
down.  Then the verdict (verdict.py) judges the cluster.

The fault label of a step says which promises it tests (audit/check.py):
a crash of the primary is `kill` or `power` (`kill` too when one of its
processes is killed and its postmaster reinitializes), of a standby
`standby-power` (nothing a level acknowledged may go), a failover to the
standby the commits waited for is `failover` (`failover-both` when that
standby lost power too, `held-failover-both` when its WAL fsyncs were held
first), to another standby `failover-async`, and every other step `none`
(a pause, a stalled disk, a setting changed: nothing may be lost).

Only a fault of the primary (a crash, a failover) may end the primary's
sessions with an error; after a standby's crash or a cut link they must
wait and go on, so an error there fails the step (`void`).  Sessions that
do not end within 90 s after the step are a hung commit, a liveness
failure.
"""
from __future__ import annotations

import os
import signal
import time

from .. import power
from ..audit import faults
from ..audit.ledger import READER_KINDS, Load
from ..scenarios.audit import session_settings
from ..util import LabError, wait_for
from . import verdict
from .verdict import START_S
from .cluster import HistoryCluster, lsn_int, wait_accepting
from .schedule import AT_CRASH_SWITCH, CRASHES, FAILOVERS, ZOMBIE_S, Step


def _crash(hc: HistoryCluster, node, power_loss: bool, load: Load, before_start=None) -> dict:
    """Crash a node (with its links' in-flight WAL on a power loss) and
    start it again; `before_start()` runs in between."""
    proxies = []
    if power_loss:
        proxies = [s.proxy.pid for s in hc.standbys() if s.upstream is node and s.proxy and s.proxy.pid]
    # only a crash of the primary may end its sessions: one of a standby must
    # not (its commits wait for it), so errors then fail the step as `void`
    mark = (lambda: setattr(load, "fault_at", time.monotonic())) if node is hc.primary else None
    undone = faults.crash([node], power_loss=power_loss, proxies=proxies, mark=mark)
    return {"recovery_s": _restart(hc, node, before_start), "undone": undone[node.name]}


def _crash_in_recovery(hc: HistoryCluster, node, load: Load, moment_ms: int) -> dict:
    """A power loss, a start, and a second power loss `moment_ms` after it,
    while the node recovers from the first (or, if it was that quick, soon
    after); then a start that must succeed."""
    def feeds():
        return [s.proxy.pid for s in hc.standbys() if s.upstream is node and s.proxy and s.proxy.pid]
    mark = (lambda: setattr(load, "fault_at", time.monotonic())) if node is hc.primary else None
    old_pm = node.pid()
    first = faults.crash([node], power_loss=True, proxies=feeds(), mark=mark)
    histories = set((node.datadir / "pg_wal").glob("*.history"))
    _before_restart(hc, node)
    node.start(wait=False)
    # the lock file the power loss left names the old postmaster until the
    # new one writes its own
    wait_for(lambda: (p := node.pid()) not in (None, old_pm) and faults.alive(p), 30,
             f"{node.name}'s new postmaster", interval=0.005)
    extra = {}
    if moment_ms == AT_CRASH_SWITCH:
        # the history file of a crash switch, then the end-of-recovery
        # record a few milliseconds later: the startup process is stopped
        # the moment the file appears (as a promote-power:history does)
        t1 = last_asked = time.monotonic()
        startup = None
        while not (new := set((node.datadir / "pg_wal").glob("*.history")) - histories):
            if startup is None:  # found ahead: the window is milliseconds
                startup = next((p for p in faults.working_in(node.datadir) if _is_startup(p)), None)
            if time.monotonic() - last_asked > 0.05:
                last_asked = time.monotonic()
                if faults.accepts(node) or last_asked - t1 > 60:
                    break
            time.sleep(0.0002)
        if new and startup:
            faults.signal_all([startup], signal.SIGSTOP)
        extra = {"crash_switch_seen": sorted(h.name for h in new),
                 "crash_switch_after_ms": round((time.monotonic() - t1) * 1000, 1)}
    else:
        time.sleep(moment_ms / 1000)
    recovered = faults.accepts(node)
    second = faults.crash([node], power_loss=True, proxies=feeds())
    return {"recovery_s": _restart(hc, node), "undone": first[node.name], "undone_second": second[node.name],
            "second_in_recovery": not recovered, **extra}


def _is_startup(pid: int) -> bool:
    """Whether `pid` is a server's startup process (by its process title)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"startup" in f.read()
    except OSError:
        return False


def _restart(hc: HistoryCluster, node, before_start=None) -> float:
    """Start a crashed node again, with new proxies for the links its power
    loss took down; returns the seconds its crash recovery took."""
    _before_restart(hc, node, before_start)
    return round(faults.start(node), 3)


def _before_restart(hc: HistoryCluster, node, before_start=None) -> None:
    """New proxies for the links a crashed node's power loss took down, and
    no lock file it cannot start with."""
    for s in hc.standbys():
        if s.upstream is node and s.proxy and s.proxy.proc.poll() is not None:
            faults.heal(s)
    if before_start:
        before_start()
    faults.drop_garbled_lock_file(node)


def label_of(hc: HistoryCluster, step: Step, sync_name: str | None) -> str:
    if step.kind == "disk-full":
        # a full disk can PANIC the primary (a WAL segment it cannot create):
        # judged as a crash that keeps the page cache; on a standby or the
        # archive nothing the primary acknowledged may go
        return "kill" if step.args[0] == hc.primary.name else verdict.NONE
    if step.kind not in CRASHES:
        return verdict.NONE
    target = step.args[0]
    if step.kind in FAILOVERS:
        return step.kind if target == sync_name else verdict.ASYNC_FAILOVER
    if target == hc.primary.name:
        return {"kill": "kill", "kill-proc": "kill", "held-power": "held-power"}.get(step.kind, "power")
    return "standby-power"


# kill-proc's process names, as pg_stat_activity's backend_type
_BACKEND_TYPE = {"walsender": "walsender", "backend": "client backend", "walreceiver": "walreceiver",
                 "startup": "startup", "flush-worker": "walreceiver flush worker"}


def _kill_process(hc: HistoryCluster, node, proc: str, load: Load) -> dict:
    """SIGKILL one of the node's server processes.  The postmaster then
    reinitializes (every child's abnormal exit is a crash to it); the
    verdict's liveness check waits for the node to serve again.  A walsender
    killed is the synchronous standby's where there is one; a client backend
    one that runs the ledger's work."""
    if proc == "walsender":
        q = "SELECT pid FROM pg_stat_replication ORDER BY sync_state = 'sync' DESC, application_name LIMIT 1"
    elif proc == "backend":
        q = ("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
             "AND query LIKE '%audit%' ORDER BY pid LIMIT 1")
    else:
        q = f"SELECT pid FROM pg_stat_activity WHERE backend_type = '{_BACKEND_TYPE[proc]}' LIMIT 1"
    # a flush worker starts once its walreceiver has WAL to hand it, a
    # walsender once its standby reconnected: give each a moment
    deadline = time.monotonic() + 10
    while (pid := node.scalar(q)) is None:
        if time.monotonic() > deadline:
            raise LabError(f"kill-proc: {node.name} runs no {proc} to kill (waited 10 s)")
        time.sleep(0.05)
    if node is hc.primary:
        load.fault_at = time.monotonic()  # the reinitialization ends the primary's sessions
    pm = node.pid()
    os.kill(pid, signal.SIGKILL)
    out = {"killed": [node.name, pid], "process": proc}
    if proc == "startup":
        # a startup process that dies is catastrophic to its postmaster: it
        # stops the other processes and exits instead of reinitializing
        # (postmaster.c), so the node is started again, as a cluster manager
        # would
        wait_for(lambda: pm is None or not faults.alive(pm), 60, f"{node.name}'s postmaster to exit")
        node.running = False
        out["recovery_s"] = _restart(hc, node)
    else:
        # once the postmaster has reaped the process it refuses connections
        # until every process is gone and crash recovery ran
        t0 = time.monotonic()
        wait_for(lambda: not faults.exists(pid), 30, f"{node.name}'s {proc} to be reaped", interval=0.005)
        wait_accepting(node, START_S)
        out["recovery_s"] = round(time.monotonic() - t0, 3)
    return out


def _fill(mount, what: str):
    """A ballast file that leaves the server user no space on `mount`
    (allocated by root: the reserved blocks stay root's); returns its
    path and size.  Fails if the file system is not full after it."""
    ballast = mount / "ballast"
    vfs = os.statvfs(mount)
    size = vfs.f_bavail * vfs.f_frsize
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        ballast.unlink()
        raise
    finally:
        os.close(fd)
    vfs = os.statvfs(mount)
    left = vfs.f_bavail * vfs.f_frsize
    if left > 1 << 20:
        ballast.unlink()
        raise LabError(f"disk-full: {what} still has {left >> 10} kB free for the server user after the "
                       "ballast: the disk is not full")
    return ballast, size


def _archive_full(hc: HistoryCluster, moment_ms: int) -> dict:
    """The shared archive's file system filled for `moment_ms`: every
    node's archive_command fails (cp: no space) and is retried; nothing may
    be lost and archiving must catch up once it is freed (the verdict
    compares the archive with the primary's WAL)."""
    if not hc.archive_disk.mounted:
        raise LabError("disk-full: the archive has no file system of its own")

    def failed() -> int:
        return sum(n.scalar("SELECT failed_count FROM pg_stat_archiver") or 0 for n in hc.live())

    before = failed()
    ballast, size = _fill(hc.archive_disk.mountpoint, "the archive")
    try:
        # a segment to archive now (the archivers are woken at once), so
        # that the full archive is met within the moment
        hc.primary.sql("SELECT pg_switch_wal()")
        time.sleep(moment_ms / 1000)
    finally:
        ballast.unlink()
    # how often archiving failed meanwhile: the fault bit
    return {"disk_full_mb": size >> 20, "archive_failures": failed() - before}


def _disk_full(hc: HistoryCluster, node, load: Load, moment_ms: int) -> dict:
    """Fill the node's file system for `moment_ms` while the load goes on,
    then free it.  The ballast is allocated by root, so the file system's
    reserved blocks stay free for root only: the server user meets ENOSPC at
    its next write that needs new space (a relation extended, a WAL segment
    created, a horizon or history file written).  A WAL segment that cannot
    be created is a PANIC, and the postmaster reinitializes; if its startup
    then failed while the disk was still full, the postmaster has exited,
    and the node is started again, as a cluster manager would."""
    mount = node.disk.mountpoint
    if not node.disk.mounted:
        raise LabError(f"disk-full: {node.name} has no file system of its own")
    if node is hc.primary:
        load.fault_at = time.monotonic()  # statements that need space fail: allowed on the primary
    pm = node.pid()
    ballast, size = _fill(mount, f"{node.name}'s file system")
    try:
        time.sleep(moment_ms / 1000)
    finally:
        ballast.unlink()
    out = {"disk_full_mb": size >> 20, "restarted": False}
    t0 = time.monotonic()
    while not faults.accepts(node):
        if pm is None or not faults.alive(pm):
            # its startup (after a PANIC) failed while the disk was full, and
            # the postmaster gave up
            node.running = False
            out["restarted"] = True
            _restart(hc, node)
            break
        if time.monotonic() - t0 > START_S:
            raise LabError(f"disk-full: {node.name} did not accept connections within {START_S} s after its "
                           "disk was freed")
        time.sleep(0.05)
    out["recovery_s"] = round(time.monotonic() - t0, 3)
    # While the disk was full the shim could not record what some writes
    # replaced (its undo logs need space too): a later power loss could not
    # undo them.  So the step ends as if the OS had written its page cache
    # back (a real kernel may do that any time): every write so far is
    # durable, and the emulation is exact again from here.  Any other
    # failure of the shim stays loud.
    vdir = faults.volatile_dir(node)
    failed = vdir / "FAILED"
    if failed.exists():
        lines = failed.read_text().splitlines()
        other = [ln for ln in lines if not ("cannot record a write" in ln and "No space left on device" in ln)]
        if other:
            raise LabError(f"disk-full: the volatile page cache of {node.name} failed otherwise: {other[:3]}")
        failed.unlink()
        out["unrecorded_writes"] = len(lines)
    out["written_back_logs"] = power.write_back(vdir)
    return out


# a short hold before the one a step is about: PRIME_S, then PRIME_GAP_S free
PRIME_S, PRIME_GAP_S = 0.5, 0.02


def _prime_flush_worker(hc: HistoryCluster, node) -> bool:
    """Before a hold of a standby whose flush worker is on, make its
    walreceiver hand its fsyncs to the worker: it does so only once its
    fsyncs have been slow (wal_receiver_flush_worker_min_fsync, a moving
    average), and otherwise the hold that follows finds the walreceiver
    itself in fsync(), and the worker's flushes are never held.  A first
    hold of PRIME_S makes one fsync that slow; the step's own hold follows
    PRIME_GAP_S after its release, well within the many fsyncs the average
    needs to fall back.  Returns whether it primed."""
    if node is hc.primary or "fw" not in feature_state(hc, node).split("+"):
        return False
    faults.hold(node)
    try:
        time.sleep(PRIME_S)
    finally:
        faults.release(node)
    time.sleep(PRIME_GAP_S)
    return True


def _worker_in_fsync(node) -> bool:
    """Whether `node`'s flush worker is in a WAL fsync now."""
    try:
        return bool(node.scalar("SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = "
                                "'walreceiver flush worker' AND wait_event = 'WalSync'"))
    except Exception:  # noqa: BLE001 - the node restarting: not seen
        return False


def _watch_held_flushes(hc: HistoryCluster, node, seconds: float, primed: bool = False) -> dict:
    """While `node`'s WAL fsyncs are held (faults.hold, before this call),
    watch for `seconds` what its upstream sees it report flushed.  The
    position it had written once the hold was in place bounds every flush
    it can report meanwhile: WAL written later needs an fsync, and every
    fsync waits (one that began before the hold covers only WAL written
    before it).  A report beyond that bound is a flush without an fsync:
    a safety failure, whatever the level (a standby that lies about its
    flush loses what `on` was promised only if it then loses power and is
    promoted, which few histories draw; the lie itself shows at once).
    After a prime (_prime_flush_worker) it also records whether the flush
    worker was seen waiting in a held fsync: the prime's proof."""
    end = time.monotonic() + seconds
    worker_held = False
    upstream = node.upstream
    written = None
    if upstream is not None and upstream.name not in hc.down:
        try:
            written = node.scalar("SELECT written_lsn::text FROM pg_stat_wal_receiver")
        except Exception:  # noqa: BLE001 - no walreceiver now: nothing to bound
            written = None
    bound = lsn_int(written) if written else None
    seen, seen_text = 0, None
    while True:
        left = end - time.monotonic()
        if bound is not None:
            try:
                f = upstream.scalar("SELECT flush_lsn::text FROM pg_stat_replication WHERE application_name = %s",
                                    (node.name,))
            except Exception:  # noqa: BLE001 - the upstream restarting: look again
                f = None
            if f and lsn_int(f) > seen:
                seen, seen_text = lsn_int(f), f
        if primed and not worker_held:
            worker_held = _worker_in_fsync(node)
        if left <= 0:
            break
        time.sleep(min(0.02, left))
    if bound is not None and seen > bound:
        raise verdict.Failure(f"safety: {node.name} reported WAL flushed up to {seen_text} while its WAL fsyncs "
                              f"were held, beyond the {written} it had written when the hold began: a flush "
                              "reported without an fsync")
    out = {"held_written": bound, "held_flush_seen": seen or None}
    if primed:
        out["worker_held"] = worker_held
    return out


def _prove_one_way(hc: HistoryCluster, primary, began: str) -> int:
    """At the end of a one-way stall of the primary's links, prove it was
    one: every direct standby that streams sent a reply after the stall
    began (the up direction flowed), and has received less than the
    primary sent it (the down direction held).  Returns the number of links
    proven; a link that shows otherwise, or none at all, is a lab error:
    the step would be judged under a label that was not true."""
    proven = 0
    for s in hc.standbys():
        if s.upstream is not primary or not s.proxy:
            continue
        rows = primary.sql("SELECT sent_lsn::text, reply_time > %s::timestamptz FROM pg_stat_replication "
                           "WHERE application_name = %s", (began, s.name))
        if not rows:
            continue  # not streaming now: nothing to prove on this link
        sent, replied = rows[0]
        has = s.scalar("SELECT received_lsn::text FROM pg_stat_wal_receiver")
        if not replied:
            raise LabError(f"one-way stall: no reply from {s.name} reached {primary.name} while its WAL was "
                           "held (the up direction stalled too)")
        if has is None or lsn_int(has) >= lsn_int(sent):
            raise LabError(f"one-way stall: {s.name} received up to {has}, all {primary.name} sent ({sent}): "
                           "the down direction was not held")
        proven += 1
    if not proven:
        raise LabError(f"one-way stall: no standby streamed from {primary.name} to prove it on")
    return proven


def _check_receipt(node) -> dict:
    """With its links stalled, what `node`'s upstream counts as received by
    it (pg_stat_replication.receive_lsn: the last position it reported)
    may not be ahead of what it has received (pg_stat_wal_receiver, read
    afterwards: it only grows while the walreceiver runs).  A primary that
    counted WAL still in the stalled link as received would release
    remote_receive commits the failover then loses; this sees the miscount
    at every stalled failover, whatever the level."""
    upstream = node.upstream
    if upstream is None:
        return {}
    try:
        counted = upstream.scalar("SELECT receive_lsn::text FROM pg_stat_replication WHERE application_name = %s",
                                  (node.name,))
        has = node.scalar("SELECT received_lsn::text FROM pg_stat_wal_receiver")
    except Exception:  # noqa: BLE001 - a server without the receive columns (stock), or no walreceiver now
        return {}
    if not counted or not has:
        return {}
    if lsn_int(counted) > lsn_int(has):
        raise verdict.Failure(f"safety: {upstream.name} counted WAL up to {counted} as received by {node.name}, "
                              f"which had received only up to {has} (its link stalled)")
    return {"receipt_counted": counted, "receipt_had": has}


def _paused_failover(hc: HistoryCluster, primary, target, load: Load, moment_ms: int) -> dict:
    """The primary frozen (SIGSTOP) with commits in flight for `moment_ms`,
    `target` promoted and the others repointed while it is; then the old
    primary continues for ZOMBIE_S, a zombie that still thinks it is
    primary: its sessions go on, and a commit that waits for a standby
    finds none (the standbys follow the new primary, their old links are
    gone).  Then it is fenced, SIGKILLed as a cluster manager that lost
    its lease does, and stays down until a rejoin, which rewinds what it
    wrote as a zombie.  A commit it acknowledged meanwhile at a level that
    waits for a standby is a broken promise: the verdict judges the step
    as a failover."""
    load.fault_at = time.monotonic()  # the fence ends the primary's sessions
    stopped = faults.pause(primary)
    try:
        time.sleep(moment_ms / 1000)
        out = hc.promote(target)
    finally:
        faults.resume(stopped)
    time.sleep(ZOMBIE_S)
    undone = faults.crash([primary], power_loss=False)
    out["undone"] = undone[primary.name]
    out["zombie_s"] = ZOMBIE_S
    return out


def target_state(hc: HistoryCluster, step: Step, sync_name: str | None) -> dict:
    """The role of the node a step acts on, and the features in effect there,
    as the step begins: the report's coverage matrix counts steps by them."""
    name = step.args[0] if step.args else None
    node = hc.c.nodes.get(name) if name else None
    if node is None:
        return {"role": "cluster", "features": feature_state(hc, None)}
    if name in hc.down:
        role = "down"
    elif node is hc.primary:
        role = "primary"
    elif name == sync_name:
        role = "sync"
    elif node.upstream is hc.primary:
        role = "potential"
    else:
        role = "cascade"
    return {"role": role, "features": feature_state(hc, node if role != "primary" else None)}


def feature_state(hc: HistoryCluster, standby) -> str:
    """'uw' when the primary streams unflushed WAL, then for a standby
    'accepts' when it takes it and 'fw' when its flush worker is on; '-' for
    none."""
    parts = []
    if hc.primary.conf_extra.get("stream_unflushed_wal", hc.c.spec.settings.get("stream_unflushed_wal")) \
            == "written":
        parts.append("uw")
    if standby is not None:
        extra = {**hc.c.spec.settings, **standby.conf_extra}
        if extra.get("wal_receiver_accept_unflushed") == "on":
            parts.append("accepts")
        if extra.get("wal_receiver_flush_worker") == "on":
            parts.append("fw")
    return "+".join(parts) or "-"


def run_step(hc: HistoryCluster, step: Step, index: int, readers: list[str]) -> dict:
    """Carry out `step` (the history's step `index`); returns its record
    without the verdict's parts (the caller judges)."""
    primary = hc.primary
    with primary.connect() as c:
        c.execute("INSERT INTO audit_hot VALUES (%s, 0)", (index,))
    sync_name = hc.sync_standby()
    label = label_of(hc, step, sync_name)
    # a reader on the synchronous standby too, where the commits' WAL must
    # be flushed before it shows (verdict: check.reads_promised)
    reader_standby = hc.node(sync_name) if sync_name in hc.c.nodes else None
    load = Load(primary.conninfo(), index, session_settings(step.level, primary),
                [r for r in READER_KINDS if r in readers] + (["standby"] if reader_standby else []),
                standby_conninfo=reader_standby.conninfo() if reader_standby else None)
    rec: dict = {"step": index, "text": str(step), "label": label, "sync": sync_name,
                 "standby_reader": reader_standby.name if reader_standby else None,
                 **target_state(hc, step, sync_name)}
    load.start()
    time.sleep(step.load_ms / 1000)
    target = hc.node(step.args[0]) if step.args and step.args[0] in hc.c.nodes else None
    failed: BaseException | None = None
    try:
        if step.kind in ("kill", "power"):
            rec.update(_crash(hc, target, step.kind == "power", load))
        elif step.kind == "switch-power":
            primary.sql("SELECT pg_switch_wal()")
            rec.update(_crash(hc, target, True, load))
        elif step.kind == "held-power":
            faults.hold(primary)
            try:
                time.sleep(step.moment_ms / 1000)
                # released before the restart: held, its start-up fsyncs
                # would each wait the shim's 10 s
                rec.update(_crash(hc, primary, True, load, before_start=lambda: faults.release(primary)))
            finally:
                faults.release(primary)
        elif step.kind == "power-in-recovery":
            rec.update(_crash_in_recovery(hc, target, load, step.moment_ms))
        elif step.kind == "kill-proc":
            rec.update(_kill_process(hc, target, step.args[1], load))
        elif step.kind == "pause":
            stopped = faults.pause(target)
            try:
                time.sleep(step.moment_ms / 1000)
            finally:
                faults.resume(stopped)
        elif step.kind == "disk-full" and step.args[0] == "archive":
            rec.update(_archive_full(hc, step.moment_ms))
        elif step.kind == "disk-full":
            rec.update(_disk_full(hc, target, load, step.moment_ms))
        elif step.kind == "io-stall":
            rec["primed"] = _prime_flush_worker(hc, target)
            faults.hold(target)
            try:
                if target is primary:
                    time.sleep(step.moment_ms / 1000)
                else:
                    rec.update(_watch_held_flushes(hc, target, step.moment_ms / 1000, rec["primed"]))
            finally:
                faults.release(target)
        elif step.kind == "paused-failover":
            rec.update(_paused_failover(hc, primary, target, load, step.moment_ms))
        elif step.kind in FAILOVERS:
            both = step.kind in ("failover-both", "held-failover-both")  # the target loses power too
            held = step.kind == "held-failover-both"
            proxies = [s.proxy.pid for s in hc.standbys() if s.upstream is primary and s.proxy and s.proxy.pid]
            crashed = [primary]
            if both:
                # the target's own links die with it too
                crashed.append(target)
                proxies += [s.proxy.pid for s in hc.standbys() if s.upstream is target and s.proxy and s.proxy.pid]
            if held:
                # the target's fsyncs wait while its links flow: what it
                # acknowledges meanwhile as flushed (on, remote_apply) must
                # survive its power loss; released before it starts again
                rec["primed"] = _prime_flush_worker(hc, target)
                faults.hold(target)
            elif step.kind == "one-way-failover":
                # only the primary's WAL stalls; the standbys' replies still
                # arrive, and must not count what the links hold
                stall_began = primary.scalar("SELECT now()::text")
                for pid in proxies:
                    faults.stall_down(pid)
            elif step.moment_ms:
                # the primary's links stall while the load goes on: commits
                # that must wait for a standby wait, and the power loss takes
                # what the links hold (a server that answered them anyway
                # loses them)
                for pid in proxies:
                    faults.stall(pid)
            try:
                if held:
                    rec.update(_watch_held_flushes(hc, target, step.moment_ms / 1000, rec["primed"]))
                else:
                    time.sleep(step.moment_ms / 1000)
                    if step.kind == "one-way-failover":
                        rec["one_way_links"] = _prove_one_way(hc, primary, stall_began)
                    if step.moment_ms:
                        rec.update(_check_receipt(target))
                undone = faults.crash(crashed, power_loss=True, proxies=proxies,
                                      mark=lambda: setattr(load, "fault_at", time.monotonic()))
            except BaseException:
                # a check failed before the power loss: the links flow
                # again, so that the commits waiting on them end and the
                # check's own failure is what the history reports
                for pid in proxies:
                    faults.unstall(pid)
                raise
            finally:
                if held:
                    faults.release(target)
            rec["undone"] = undone[primary.name]
            if both:
                rec["undone_target"] = undone[target.name]
                rec["recovery_s"] = _restart(hc, target)
            if step.kind == "promote-power":
                at = step.args[1]
                rec.update(hc.promote(target, at if at == "history" else int(at), lambda: {
                    "crash_at": at,
                    **{k + "_target": v for k, v in _crash(hc, target, True, load).items()}}))
            else:
                rec.update(hc.promote(target))
            if rec["timeline_after"] <= rec["timeline_known"]:
                raise verdict.Failure(
                    f"timeline: {target.name} came out of its promotion a primary of timeline "
                    f"{rec['timeline_after']}, not of a timeline above the {rec['timeline_known']} it knew: "
                    "a fork of the old timeline"
                    + (" (it lost power while it promoted)" if step.kind == "promote-power" else ""))
            if (rec["timeline_entered_by"] or "").startswith("crash recovery"):
                # its promotion's timeline is not in its history: it came
                # back a primary of the timeline it had, and only the crash
                # switch of a primary that streams unflushed WAL moved it on
                raise verdict.Failure(
                    f"timeline: {target.name} came out of its promotion on timeline {rec['timeline_after']}, "
                    f"which a crash switch made from a timeline it had ({rec['timeline_entered_by']}): its "
                    "promotion's timeline is not in its history, so it had started a primary of the old "
                    "timeline")
        elif step.kind == "partition":
            # a cut link delays the primary's commits, it must not fail them:
            # session errors now fail the step (fault_at stays unset)
            faults.cut(target)
            time.sleep(step.moment_ms / 1000)
            faults.heal(target)
    except BaseException as e:
        failed = e
        raise
    finally:
        try:
            load.finish()
        except TimeoutError:
            # a commit that never returns is what a release bug in the
            # synchronous waits looks like from the client; after the
            # step's own failure it is that failure's consequence, and the
            # failure is reported
            if failed is None:
                raise verdict.Failure(f"liveness: hung commit: sessions of step {index} did not end "
                                      f"within 90 s after it") from None
    rec["acked_total"] = sum(len(w.acked) for w in load.writers)
    rec["errors_before_fault"] = [x.error for x in load.writers + load.readers if x.error_before_fault]
    if step.kind == "rejoin":
        rec["rewind"] = hc.rejoin(step.args[0])
    elif step.kind == "rewind-power":
        rec.update(hc.rejoin_cut(step.args[0], step.moment_ms))
    elif step.kind == "restart":
        hc.stop(target)
        target.start()
    elif step.kind == "uw":
        for n in hc.c.nodes.values():
            n.conf_extra["stream_unflushed_wal"] = step.args[0]
            if n in hc.live():
                n.write_node_conf()
                n.sql("SELECT pg_reload_conf()")
    elif step.kind == "summarize":
        for n in hc.c.nodes.values():
            n.conf_extra["summarize_wal"] = step.args[0]
            if n in hc.live():
                n.write_node_conf()
                n.sql("SELECT pg_reload_conf()")
    elif step.kind == "fw":
        target.conf_extra["wal_receiver_flush_worker"] = step.args[1]
        target.write_node_conf()
        target.sql("SELECT pg_reload_conf()")
    elif step.kind == "sync":
        hc.make_sync(target)
    elif step.kind == "rebuild":
        hc.rebuild(target, hc.node(step.args[1]), step.args[2])
    rec["load"] = load
    return rec
