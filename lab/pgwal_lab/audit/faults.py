"""Faults the audit injects into lab nodes (topology.Node).

`crash()` stops every process of a node's server at once and kills it:
SIGSTOP to the postmaster (it can then fork nothing new), SIGSTOP to each
of its children and to theirs (an archive_command's shell), then SIGKILL
to all.  No server process runs between the
first stop and the kill, so none finishes a write the crash should have
cut off, as `pg_ctl -m immediate` would let it.  A SIGSTOP that arrives
while the postmaster is inside fork() no longer cancels the fork (Linux
5.0 on): the child appears once the fork returns, which under load can be
after kill() did.  So the children are listed again only once the
postmaster is seen stopped, and after the kill no process may still work
in the data directory.  With `power=True` the
node's volatile page cache is then thrown away (power.undo): what was not
fsynced is gone.  Several nodes crashed together are all stopped before
any is killed.

Chosen moments: `hold()` makes the node's WAL fsyncs wait (the shim's hold
file) until `release()`, so what it wrote stays in its volatile page cache
for as long as the audit wants; `cut()` and `heal()` break and restore a
standby's link (its connections reset, reconnects refused meanwhile).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .. import power
from ..util import LabError, popen, run, wait_for


def children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        # the command may contain spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(d))
    return out


def _exists(pid: int) -> bool:
    """A process, zombies included: the server's lock file check (kill(pid, 0))
    counts a postmaster that is dead but not yet reaped as running."""
    return Path(f"/proc/{pid}").exists()


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2] != "Z"


def _state(pid: int) -> str | None:
    """The process state letter (R, S, D, T, Z, ...), or None once it is gone."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return st[st.rfind(")") + 2]


def _wait_stopped(pid: int, timeout: float = 10) -> None:
    """Until a process signalled SIGSTOP is stopped (or gone): before that it
    may still be finishing a fork."""
    wait_for(lambda: _state(pid) in (None, "T", "t", "Z", "X"), timeout,
             f"process {pid} to stop", interval=0.0005)


def working_in(directory: Path, among=None) -> list[int]:
    """Processes whose working directory is `directory` (or below): every
    server process works in its data directory, orphans included.  With
    `among`, only those pids are looked at."""
    out = []
    target = os.path.realpath(directory)
    for d in (os.listdir("/proc") if among is None else map(str, among)):
        if not d.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{d}/cwd")
        except OSError:
            continue
        if cwd == target or cwd.startswith(target + "/"):
            out.append(int(d))
    return out


def become_subreaper() -> bool:
    """Have orphaned descendants (a postmaster once its pg_ctl exited, a
    killed postmaster's children) reparented to this process, not to init:
    crash() then reaps them at once.  Init here reaps only every second or
    two, and a restart must wait until the old processes are gone.  A
    postmaster stopped cleanly stays this process's zombie until it exits;
    the audit stops its servers only at its end."""
    import ctypes

    pr_set_child_subreaper = 36
    return ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0


def _reap(pids) -> None:
    """Collect the killed server processes that are this process's zombies
    (see become_subreaper).  Only they are in `pids`: none was started by
    subprocess, whose own wait must keep its child's status."""
    me = os.getpid()
    for p in pids:
        if _state(p) == "Z" and _parent(p) == me:
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass


def _stat_field(pid: int, index: int) -> int | None:
    """Field `index` after the command of /proc/PID/stat (1: the parent, 2:
    the process group), or None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command may contain spaces and parentheses: fields follow the last ')'
    return int(stat[stat.rfind(")") + 2:].split()[index])


def _pgrp(pid: int) -> int | None:
    """The process group of `pid`, or None once it is gone."""
    return _stat_field(pid, 2)


def _parent(pid: int) -> int | None:
    """The parent of `pid` (zombies included), or None once it is gone."""
    return _stat_field(pid, 1)


def signal_all(pids, sig) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def volatile_dir(node) -> Path:
    """The node's undo logs: on its own file system, outside the data directory."""
    return node.root / "mnt" / "volatile"


def hold_file(node) -> Path:
    """While this file exists the node's WAL fsyncs wait (pgwal_shim.c)."""
    return node.root / "mnt" / "hold-wal-fsync"


def arm(node) -> None:
    """Give the node a volatile page cache from its next start on, and WAL
    fsyncs that hold() can hold (pg_wal only; the data files sync as ever)."""
    d = volatile_dir(node)
    power.prepare(d)
    release(node)
    node.extra_env = {**power.volatile_env(d, node.datadir), "PGWAL_SHIM_HOLD_FILE": str(hold_file(node)),
                      "PGWAL_SHIM_MATCH": "/pg_wal/"}


def hold(node) -> None:
    """From now on the node's WAL fsyncs wait (at most 10 s) until release()."""
    hold_file(node).touch()


def release(node) -> None:
    hold_file(node).unlink(missing_ok=True)


def cut(node) -> None:
    """Cut a standby's link: its delay proxy dies, which resets both
    connections, and nothing listens on its port until heal()."""
    node.proxy.proc.kill()
    node.proxy.proc.wait(timeout=10)


def heal(node) -> None:
    """A new proxy on the cut link's port: the walreceiver's next attempt connects."""
    node.proxy.start()


def stall(pid: int) -> None:
    """Freeze a delay proxy: the link stalls, what it holds stays in flight."""
    os.kill(pid, signal.SIGSTOP)


def unstall(pid: int) -> None:
    """Let a stalled delay proxy (stall() or stall_down()) flow again."""
    for sig in (signal.SIGCONT, signal.SIGUSR2):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


def stall_down(pid: int) -> None:
    """Stall a delay proxy in one direction: what the upstream sends (WAL,
    keepalives) is held in the proxy, what the standby sends (its replies)
    still flows (pgwal-netdelay holds its down direction on SIGUSR1)."""
    os.kill(pid, signal.SIGUSR1)


def unstall_down(pid: int) -> None:
    """End stall_down(): the held data goes out in order."""
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        pass


def _parents() -> dict[int, int]:
    """{pid: parent pid} of every process, from one scan of /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            ppid = _parent(int(d))
            if ppid is not None:
                out[int(d)] = ppid
    return out


def _stop_descendants(stopped: list[int]) -> list[int]:
    """`stopped` and every descendant of theirs, all stopped.  A server
    child's own children (the shell and cp of an archive_command, a
    restore_command) would otherwise run on after the crash, orphaned: on a
    machine that lost power they die with the rest.  Level by level: a
    stopped parent forks no more, but a fork in flight may still return,
    so each level is stopped and seen stopped before the next is listed."""
    found, known = list(stopped), set(stopped)
    while True:
        new = [p for p, ppid in _parents().items() if ppid in known and p not in known]
        if not new:
            return found
        signal_all(new, signal.SIGSTOP)
        for p in new:
            _wait_stopped(p)
        found += new
        known.update(new)


def crash(nodes: list, power_loss: bool, proxies: list[int] = (), mark=None) -> dict:
    """Crash the nodes together; returns {node name: undo stats or {}}.
    `proxies` (pids of delay proxies) die with them, and with them the WAL
    in flight on those links, as with a machine that lost power.  `mark()`
    is called just before the first process stops: the moment of the fault."""
    stopped: dict[str, list[int]] = {}
    # the children are listed before anything stops (a scan of /proc takes
    # milliseconds, during which they would run on); the postmaster stops
    # next, so no child appears after a second scan
    first: dict[str, list[int]] = {}
    for n in nodes:
        pm = n.pid()
        if pm is None or not _alive(pm):
            raise LabError(f"{n.name}: no running postmaster to crash")
        if pm not in working_in(n.datadir, [pm]):
            # a lock file an emulated power loss put back names a pid that
            # may now be any process's: stopping it would crash a stranger
            raise LabError(f"{n.name}: postmaster.pid names pid {pm}, which does not work in "
                           f"{n.datadir}: a stale lock file; nothing was stopped")
        first[n.name] = [pm, *children(pm)]
    if mark:
        mark()
    signal_all(proxies, signal.SIGSTOP)
    for pids in first.values():
        signal_all(pids, signal.SIGSTOP)
    for n in nodes:
        pm = first[n.name][0]
        _wait_stopped(pm)
        # A child listed above may have exited meanwhile and its pid gone to
        # another process: pids wrap within minutes at the default pid_max of
        # 32768 while two audits run. Only processes still the postmaster's
        # are killed; a stranger stopped by mistake runs on.
        ours = [pm] + [p for p in first[n.name][1:] if _parent(p) == pm]
        signal_all([p for p in first[n.name][1:] if p not in ours], signal.SIGCONT)
        late = [k for k in children(pm) if k not in ours]
        signal_all(late, signal.SIGSTOP)
        stopped[n.name] = _stop_descendants(ours + late)
    for pids in [*stopped.values(), list(proxies)]:
        signal_all(pids, signal.SIGKILL)
    for n in nodes:
        pids = stopped[n.name]
        wait_for(lambda: _reap(pids) or not any(_exists(p) for p in pids), 30,
                 f"{n.name}'s processes to die and be reaped", interval=0.005)
        n.running = False
    for n in nodes:
        # a process that escaped the stop ran after the moment of the fault:
        # the crash was not one, and its shared memory would stop the restart
        left = working_in(n.datadir)
        if left:
            signal_all(left, signal.SIGKILL)
            raise LabError(f"{n.name}: processes {left} outlived its crash (not the postmaster's children "
                           "when it stopped); the cycle is not a crash")
    out = {}
    for n in nodes:
        out[n.name] = power.undo(volatile_dir(n), [n.datadir]).asdict() if power_loss else {}
        if power_loss:
            power.prepare(volatile_dir(n))
    return out


def pause(node) -> list[int]:
    """Stop every process of a running node (SIGSTOP), the postmaster first
    so that it forks nothing meanwhile; returns them for resume().  Unlike
    crash() nothing is killed: the node is frozen, as a host that stalls
    (a VM paused, a swap storm) freezes it."""
    pm = node.pid()
    if pm is None or not _alive(pm):
        raise LabError(f"{node.name}: no running postmaster to pause")
    signal_all([pm], signal.SIGSTOP)
    _wait_stopped(pm)
    kids = [k for k in children(pm) if _parent(k) == pm]
    signal_all(kids, signal.SIGSTOP)
    return _stop_descendants([pm, *kids])


def resume(pids: list[int]) -> None:
    """Continue what pause() stopped, the postmaster last."""
    signal_all(list(reversed(pids)), signal.SIGCONT)


def exists(pid: int) -> bool:
    """A process, zombies included (not yet reaped by its parent)."""
    return _exists(pid)


def alive(pid: int) -> bool:
    """A process that runs (not a zombie)."""
    return _alive(pid)


def accepts(node) -> bool:
    """The node answers a query now."""
    return _accepts(node)


def _accepts(node) -> bool:
    try:
        node.scalar("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def start(node, timeout: float = 120) -> float:
    """Start a crashed node; seconds until it accepts connections (polled
    every 10 ms: pg_ctl's own wait polls in 100 ms steps)."""
    t0 = time.monotonic()
    node.start(timeout=timeout, wait=False)
    gone_since = None  # the lock file is rewritten while the server starts: one empty read is no death
    while not _accepts(node):
        now = time.monotonic()
        gone_since = (gone_since or now) if node.pid() is None else None
        if now - t0 > timeout or (gone_since is not None and now - gone_since > 3):
            raise LabError(f"{node.name} did not come back after the fault:\n{node.log_tail()}")
        time.sleep(0.01)
    return time.monotonic() - t0


def promote(node, timeout: float = 60) -> float:
    """Promote a standby; seconds until it is out of recovery."""
    t0 = time.monotonic()
    node.run_pg([node.bin("pg_ctl"), "-D", node.datadir, "-w", "-t", int(timeout), "promote"],
                timeout=timeout + 10)
    wait_for(lambda: not node.scalar("SELECT pg_is_in_recovery()"), timeout, f"{node.name} to be promoted")
    return time.monotonic() - t0


def rewind(node, source, timeout: float = 300) -> str:
    """pg_rewind a crashed former primary against `source` (the new primary);
    returns pg_rewind's last line.  The source checkpoints first: until the
    checkpoint that promotion requested completes, its control file names the
    old timeline, and pg_rewind (stock, before 18) would then conclude "no
    rewind required" and leave the old primary on its lost branch."""
    source.sql("CHECKPOINT")
    p = node.run_pg([node.bin("pg_rewind"), "-D", node.datadir, "--source-server",
                     f"host={source.sockdir} port={source.port} user=postgres dbname=postgres"],
                    timeout=timeout, check=False)
    if p.returncode != 0:
        raise LabError(f"pg_rewind of {node.name} failed:\n{p.stdout}\n{p.stderr}")
    out = (p.stdout + p.stderr).strip()
    if os.environ.get("PGWAL_AUDIT_DEBUG"):
        print(out, flush=True)
    lines = out.splitlines()
    return lines[-1] if lines else ""


def drop_garbled_lock_file(node) -> None:
    """A power loss can leave postmaster.pid empty or torn where it was never
    fsynced (fsync = off): pg_ctl then refuses to start.  A cluster manager
    removes such a file (a stale but readable one the server handles itself)."""
    p = node.datadir / "postmaster.pid"
    try:
        first = p.read_text().split("\n", 1)[0].strip()
    except OSError:
        return
    if not first.isdigit():
        p.unlink(missing_ok=True)


def _runs_on(pid: int, datadir: Path) -> bool:
    """A live pg_rewind or postgres whose command line names `datadir`."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not cmd or not cmd[0].endswith((b"pg_rewind", b"postgres")):
        return False
    return str(datadir).encode() in cmd and _alive(pid)


# a rewind cut's moment at or above this: the power loss comes the moment
# pg_rewind ended (waited for up to this long), before the node started
REWIND_CUT_AFTER_END_MS = 10_000


def rewind_cut(node, source, moment_ms: int) -> dict:
    """Start pg_rewind of a crashed former primary against `source` and cut
    it `moment_ms` later with a power loss of the node's host: every process
    of the run (pg_rewind, and the single-user server it starts for the
    target's crash recovery) is stopped, then killed, and what it wrote and
    did not sync is lost (power.undo).  A moment of REWIND_CUT_AFTER_END_MS
    or more cuts the moment pg_rewind ended instead: a finished target, not
    started.  Returns what the cut found: whether pg_rewind had already
    ended, and the undo statistics."""
    source.sql("CHECKPOINT")
    cmd = [node.bin("pg_rewind"), "-D", node.datadir, "--source-server",
           f"host={source.sockdir} port={source.port} user=postgres dbname=postgres"]
    p = popen(cmd, env={**os.environ, **{k: str(v) for k, v in node.env().items()}}, netns=node.netns,
              as_pg=True)
    if moment_ms >= REWIND_CUT_AFTER_END_MS:
        try:
            p.wait(timeout=moment_ms / 1000)
        except subprocess.TimeoutExpired:
            pass
    else:
        time.sleep(moment_ms / 1000)
    ended = p.poll()
    # its own process group (popen starts a session): stopped as one, so
    # that nothing of it writes between the first stop and the kill
    group = [pid for pid in _parents() if _pgrp(pid) == p.pid]
    signal_all(group, signal.SIGSTOP)
    group = _stop_descendants(group)
    signal_all(group, signal.SIGKILL)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise LabError(f"{node.name}: pg_rewind did not die after SIGKILL") from None
    rest = [x for x in group if x != p.pid]
    wait_for(lambda: _reap(rest) or not any(_exists(x) for x in rest), 30,
             f"{node.name}'s pg_rewind processes to die and be reaped", interval=0.005)
    # nothing of the run may outlive the cut (a process that left the
    # group would write on after the power loss)
    left = [x for x in working_in(node.datadir) if _alive(x)] + \
        [int(d) for d in os.listdir("/proc") if d.isdigit() and _runs_on(int(d), node.datadir)]
    if left:
        signal_all(left, signal.SIGKILL)
        raise LabError(f"{node.name}: processes {sorted(set(left))} of its pg_rewind outlived the power loss")
    out = (p.stdout.read() if p.stdout else "").strip().splitlines()
    undo = power.undo(volatile_dir(node), [node.datadir]).asdict()
    power.prepare(volatile_dir(node))
    return {"rewind_ended_before_cut": ended is not None, "rewind_exit": ended,
            "rewind_last_line": out[-1] if out else "", "undone_rewind": undo}


def make_standby_of(node, upstream) -> None:
    """Make `node` (stopped) a synchronous standby of `upstream` (running)."""
    node.upstream = upstream
    node.sync = True
    (node.datadir / "standby.signal").touch()
    run(["chown", "--reference", str(node.datadir), str(node.datadir / "standby.signal")])
    auto = node.datadir / "postgresql.auto.conf"  # pg_rewind copied the source's
    auto.write_text("")
    run(["chown", "--reference", str(node.datadir), str(auto)])
