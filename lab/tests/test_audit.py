"""The durability audit: the volatile page cache it relies on, and short
audits of the patched and the stock server that fail on any loss where
none is promised (the full run is in docs/results/durability-audit)."""
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pgwal_lab import power
from pgwal_lab.audit import check, faults
from pgwal_lab.cli import run_scenario
from pgwal_lab.scenarios import audit
from pgwal_lab.util import LabError

from .conftest import lab_leftovers


@pytest.fixture
def vdir():
    d = Path("/dev/shm") / f"pgwal-volatile-test-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    (d / "data").mkdir(parents=True)
    power.prepare(d / "logs")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _python(vdir, code: str, *args, volatile: bool = True):
    env = dict(os.environ, **(power.volatile_env(vdir / "logs", vdir / "data") if volatile else {}))
    subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(vdir / "data"), *args], env=env,
                   check=True, timeout=60)


def test_self_test_passes_with_the_shim_and_fails_without(vdir):
    power.self_test(vdir / "logs", vdir / "data", lambda cmd: subprocess.run(
        cmd, env=dict(os.environ, **power.volatile_env(vdir / "logs", vdir / "data")), check=True))
    with pytest.raises(LabError, match="not in effect"):
        power.self_test(vdir / "logs", vdir / "data", lambda cmd: subprocess.run(cmd, check=True))


def test_a_sync_from_another_process_makes_the_file_durable(vdir):
    """fsync syncs a file, not a descriptor: one process writes, another
    fsyncs, and only what was written after that sync is lost."""
    _python(vdir, """
        import os, sys
        fd = os.open(os.path.join(sys.argv[1], "f"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, b"1" * 100, 0)
    """)
    _python(vdir, """
        import os, sys
        fd = os.open(os.path.join(sys.argv[1], "f"), os.O_RDONLY)
        os.fsync(fd)
    """)
    _python(vdir, """
        import os, sys
        fd = os.open(os.path.join(sys.argv[1], "f"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"2" * 50)
    """)
    stats = power.undo(vdir / "logs", [vdir / "data"])
    assert (vdir / "data" / "f").read_bytes() == b"1" * 100
    assert stats.writes == 1 and stats.bytes == 50


def test_unsynced_file_in_a_reused_inode_is_not_touched(vdir):
    """A log belongs to one file: an unlinked file's log is an orphan, never
    applied to another file, and write-only descriptors are recorded too."""
    _python(vdir, """
        import os, sys
        p = os.path.join(sys.argv[1], "tmp")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"t" * 10)
        os.close(fd)
        os.unlink(p)
        fd = os.open(os.path.join(sys.argv[1], "kept"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"k" * 10)
        os.fdatasync(fd)
    """)
    stats = power.undo(vdir / "logs", [vdir / "data"])
    assert (vdir / "data" / "kept").read_bytes() == b"k" * 10
    assert stats.orphans == 1 and stats.writes == 0


def test_syncfs_empties_every_log_and_a_torn_entry_is_ignored(vdir):
    _python(vdir, """
        import ctypes, os, sys
        fd = os.open(os.path.join(sys.argv[1], "a"), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b"a" * 10)
        ctypes.CDLL(None).syncfs(fd)
        os.write(fd, b"b" * 10)
    """)
    logs = list((vdir / "logs").glob("*.undo"))
    assert len(logs) == 1
    with logs[0].open("ab") as f:  # a writer killed while appending its entry
        f.write(power.HEADER.pack(power.UNDO_MAGIC, 0, 0, 10, 0, 10)[:20])
    assert len(power.read_log(logs[0])) == 1
    power.undo(vdir / "logs", [vdir / "data"])
    assert (vdir / "data" / "a").read_bytes() == b"a" * 10


def test_a_held_fsync_waits_for_the_release_and_keeps_the_write_volatile(vdir):
    """The chosen-moment crashes hold WAL fsyncs: a matching file's fsync
    waits while the hold file exists (its write still undoable meanwhile),
    another file's does not, and a release lets it finish."""
    (vdir / "data" / "pg_wal").mkdir()
    hold = vdir / "hold"
    hold.touch()
    env = dict(os.environ, **power.volatile_env(vdir / "logs", vdir / "data"),
               PGWAL_SHIM_HOLD_FILE=str(hold), PGWAL_SHIM_MATCH="/pg_wal/")
    code = textwrap.dedent("""
        import os, sys, time
        for name in ("other", "pg_wal/seg"):
            fd = os.open(os.path.join(sys.argv[1], name), os.O_RDWR | os.O_CREAT, 0o600)
            os.write(fd, b"w" * 10)
            t = time.monotonic()
            os.fsync(fd)
            print(name, round(time.monotonic() - t, 3), flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code, str(vdir / "data")], env=env, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().split()[0] == "other"  # not held
    time.sleep(0.3)
    assert p.poll() is None  # pg_wal/seg's fsync is held
    logs = [e for f in (vdir / "logs").glob("*.undo") for e in power.read_log(f)]
    assert len(logs) == 1  # its write is still volatile
    hold.unlink()
    name, waited = p.stdout.readline().split()
    assert p.wait(timeout=10) == 0 and name == "pg_wal/seg" and float(waited) >= 0.3
    stats = power.undo(vdir / "logs", [vdir / "data"])
    assert stats.writes == 0 and (vdir / "data" / "pg_wal" / "seg").read_bytes() == b"w" * 10


# A stand-in postmaster: daemonized, as pg_ctl's postmaster (the test, made a
# subreaper as the audit is, reaps it and its orphans), working in its "data
# directory" and forking short-lived children as fast as it can, as a
# postmaster does under a connection storm.
_FORKING_POSTMASTER = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
os.chdir(sys.argv[1])
open("pm.pid", "w").write(str(os.getpid()))
while True:
    if os.fork() == 0:
        time.sleep(0.5)
        os._exit(0)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
"""


class _FakeNode:
    def __init__(self, datadir: Path):
        self.name, self.datadir, self.running = "fake", datadir, True

    def pid(self):
        try:
            return int((self.datadir / "pm.pid").read_text())
        except (OSError, ValueError):
            return None


def _forking_postmaster(datadir: Path) -> _FakeNode:
    faults.become_subreaper()  # as the audit does: the stand-in is reaped at once
    (datadir / "pm.pid").unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", _FORKING_POSTMASTER, str(datadir)], check=True, timeout=10)
    node = _FakeNode(datadir)
    deadline = time.monotonic() + 10
    while node.pid() is None or len(faults.children(node.pid())) < 3:
        assert time.monotonic() < deadline, "the stand-in postmaster did not start forking"
        time.sleep(0.01)
    return node


def test_crash_leaves_no_child_of_a_postmaster_caught_forking(tmp_path):
    """SIGSTOP no longer cancels a fork in flight: a child may appear after
    kill() returned.  No child may outlive the crash, in any of many tries."""
    datadir = tmp_path / "data"
    datadir.mkdir()
    try:
        for _ in range(30):
            node = _forking_postmaster(datadir)
            faults.crash([node], power_loss=False)
            time.sleep(0.02)  # a child that escaped would still be sleeping
            assert faults.working_in(datadir) == []
    finally:
        faults.signal_all(faults.working_in(datadir), 9)


# A stand-in postmaster whose child runs a shell command, as the archiver
# runs archive_command: the shell and its command are the postmaster's
# grandchildren and great-grandchildren.
_ARCHIVING_POSTMASTER = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
os.chdir(sys.argv[1])
open("pm.pid", "w").write(str(os.getpid()))
if os.fork() == 0:
    os.system("sleep 30; sleep 30")
    os._exit(0)
time.sleep(60)
"""


def test_crash_stops_the_commands_a_server_child_runs(tmp_path):
    """An archive_command in flight (sh, then cp) dies with the crash:
    orphaned, it would run on after the moment of the fault."""
    datadir = tmp_path / "data"
    datadir.mkdir()
    faults.become_subreaper()
    try:
        subprocess.run([sys.executable, "-c", _ARCHIVING_POSTMASTER, str(datadir)], check=True, timeout=10)
        node = _FakeNode(datadir)
        deadline = time.monotonic() + 10
        while node.pid() is None or len(faults.working_in(datadir)) < 4:  # pm, child, sh, sleep
            assert time.monotonic() < deadline, "the stand-in did not start its command"
            time.sleep(0.01)
        faults.crash([node], power_loss=False)
        assert faults.working_in(datadir) == []
    finally:
        faults.signal_all(faults.working_in(datadir), 9)


def test_crash_fails_loudly_when_a_process_outlives_it(tmp_path):
    """A server process that is not the postmaster's child when it stops
    (the window the stop above closes) must not pass for a crash."""
    datadir = tmp_path / "data"
    datadir.mkdir()
    stray = subprocess.Popen(["sleep", "30"], cwd=datadir)
    try:
        node = _forking_postmaster(datadir)
        with pytest.raises(LabError, match="outlived its crash"):
            faults.crash([node], power_loss=False)
        stray.wait(timeout=10)  # killed on the way out
        assert faults.working_in(datadir) == []
    finally:
        stray.kill()
        faults.signal_all(faults.working_in(datadir), 9)


def test_crash_refuses_a_lock_file_that_names_a_stranger(tmp_path):
    """postmaster.pid put back by a power loss may name a pid another
    process has now: crash() must stop nothing and say so."""
    datadir = tmp_path / "data"
    datadir.mkdir()
    stranger = subprocess.Popen(["sleep", "30"], cwd=tmp_path)
    try:
        (datadir / "pm.pid").write_text(str(stranger.pid))
        with pytest.raises(LabError, match="stale lock file"):
            faults.crash([_FakeNode(datadir)], power_loss=False)
        assert stranger.poll() is None and faults._state(stranger.pid) != "T"
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


def test_promises_table():
    assert check.acks_promised("on", "failover-both")
    assert not check.acks_promised("remote_write", "failover-both")
    assert check.acks_promised("remote_receive+flush_worker", "failover")
    assert not check.acks_promised("local_non_durable_reads", "failover")
    assert check.acks_promised("local_non_durable_reads", "power")
    assert not check.reads_promised("local_non_durable_reads", "power", "plain")
    assert check.reads_promised("local_non_durable_reads", "power", "durable")
    assert check.reads_promised("local_non_durable_reads", "kill", "xact_status")
    assert not check.reads_promised("local_non_durable_reads", "failover", "durable")
    assert check.reads_promised("on", "failover", "for_update")
    assert check.acks_promised("off", "standby-power")
    assert check.is_control("off", "kill") and check.is_control("local", "failover")
    assert check.is_control("local_non_durable_reads", "failover-both")
    assert not check.is_control("remote_write", "failover-both") and not check.is_control("on", "kill")
    # the faults that choose their moment end in one of the others
    assert check.acks_promised("remote_receive", "partition") and not check.acks_promised("local", "partition")
    assert check.acks_promised("local_non_durable_reads", "held-power")
    assert not check.reads_promised("local_non_durable_reads", "held-power", "plain")
    assert check.reads_promised("local_non_durable_reads", "held-power", "durable")
    assert check.reads_promised("on", "held-power", "plain")
    # a reader on the synchronous standby: at every level, unless another standby is promoted
    assert check.reads_promised("off", "power", "standby") and check.reads_promised("off", "failover-both", "standby")
    assert check.reads_promised("local_non_durable_reads", "held-power", "standby")
    assert not check.reads_promised("on", "failover-async", "standby")
    assert check.window_expected("local_non_durable_reads", "held-power")
    assert not check.window_expected("on", "held-power")
    assert check.is_control("remote_receive+flush_worker", "held-failover-both")
    assert not check.is_control("remote_write", "held-failover-both")
    assert check.acks_promised("on", "held-failover-both")


def _short_audit(bin_dir, tmp_path, scenario="audit", **params):
    """A smoke run of one of the audits; it leaves nothing behind."""
    before = lab_leftovers()
    records, _ = run_scenario(scenario, bin_dir, params, smoke=True, results=tmp_path, max_minutes=15, quiet=True)
    assert lab_leftovers() == before
    return records


def _assert_clean_audit(records, levels_expected):
    problems = audit.failures(records)
    assert problems is None, problems
    cells = {(r["fault"], r["level"]) for r in records}
    assert cells == {(f, lvl) for f in check.FAULTS for lvl in levels_expected}
    # a fault may come before a cycle's first acknowledgement, not in every cycle of a fault
    for f in check.FAULTS:
        assert sum(r["acked_total"] for r in records if r["fault"] == f) > 0, f
    for r in records:
        failover = check.base_fault(r["fault"]).startswith("failover")
        assert [c["node"] for c in r["checks"]] == (["promoted", "rejoined"] if failover else ["primary", "standby"])
        if r["fault"] != "kill":
            assert r["undone"], "a power loss that undid nothing on any node"


def test_short_audit_patched(pg_bin, tmp_path):
    # one round of every (fault, level) cell: the stalled and unstalled
    # failovers alternate between levels, and the chosen moments hit their
    # windows by far in one cycle (347 plain reads and 74 acknowledgements
    # lost in the run that set this); the long audits run many rounds
    # the control and each level the series adds, with on: local,
    # remote_write, on+uw and remote_apply are left to the long audits
    # (docs/results), to fit CI's 45 minutes on 2 cores
    levels = ["off", "local_non_durable_reads", "remote_receive", "remote_write+uw",
              "remote_receive+flush_worker", "on"]
    records = _short_audit(pg_bin, tmp_path, cycles=1, levels=",".join(levels))
    _assert_clean_audit(records, levels)
    assert "volatile page cache proved" in records[0]["proof"]["primary"]
    assert records[0]["proof"]["link"]["rtt_ms_min"] >= 2.0
    # the chosen moments hit their windows: early-released commits seen by
    # plain readers and then lost; receipt acknowledged by a flush worker's
    # walreceiver and lost with both nodes' page caches
    window = [c for r in records if r["fault"] == "held-power" and r["level"] == "local_non_durable_reads"
              for c in r["checks"] if c["node"] == "primary"]
    assert sum(c["reads_lost"]["plain"] for c in window) > 0
    acked_lost = [c["acked_lost"] for r in records if r["fault"] == "held-failover-both"
                  and r["level"] == "remote_receive+flush_worker" for c in r["checks"] if c["node"] == "promoted"]
    assert sum(acked_lost) > 0
    assert all(r["reconnect_s"] < 30 for r in records if r["fault"] == "partition")


def test_short_audit_stock(stock_bin, tmp_path):
    # what this run is for: the audit works on stock 18 (no patched-only
    # setting reaches it) and its control and strongest promise hold there,
    # under every fault; stock's other levels are left to the long audits
    # (docs/results), to fit CI's 45 minutes on 2 cores
    records = _short_audit(stock_bin, tmp_path, cycles=1, levels="off,on")
    _assert_clean_audit(records, ["off", "on"])


def test_audit_sees_a_broken_promise(pg_bin, tmp_path):
    """With fsync = off nothing is durable: a power loss takes acknowledged
    `local` commits, and the audit must say so."""
    records = _short_audit(pg_bin, tmp_path, levels="local", faults="power",
                           server_settings={"fsync": "off"})
    problems = audit.failures(records)
    assert problems and "acknowledged commits lost" in problems
    # the standby had WAL the primary lost: it cannot follow, and says so
    assert "could not follow" in problems


def _short_consumer_audit(bin_dir, tmp_path):
    from pgwal_lab.scenarios import audit_consumer

    records = _short_audit(bin_dir, tmp_path, "audit-consumer")
    assert audit_consumer.failures(records) is None, audit_consumer.failures(records)
    exact = [r for r in records if r["mode"] == "exact"]
    control = [r for r in records if r["mode"] == "ack-before-apply"]
    assert exact and control
    # the consumer was broken off and started again, and every transaction
    # the writers had acknowledged is in the copy exactly once
    assert all(r["consumer_starts"] > 1 for r in records)
    assert sum(r["compare"]["rows"] for r in exact) > 0
    assert all(r["compare"]["acked_not_applied"] == 0 and r["compare"]["applied_twice"] == 0 for r in exact)
    # what came again after a restart was skipped, not applied twice
    assert sum(r["redelivered_skipped"] for r in exact) > 0
    # the control, acknowledging before it applies, lost what its crash cut off
    assert all(r["compare"]["acked_not_applied"] > 0 for r in control)


def test_short_consumer_audit_patched(pg_bin, tmp_path):
    _short_consumer_audit(pg_bin, tmp_path)


def test_short_consumer_audit_stock(stock_bin, tmp_path):
    _short_consumer_audit(stock_bin, tmp_path)


def _short_receiver_audit(bin_dir, tmp_path):
    from pgwal_lab.scenarios import audit_receiver

    records = _short_audit(bin_dir, tmp_path, "audit-receiver")
    assert audit_receiver.failures(records) is None, audit_receiver.failures(records)
    cells = {(r["fault"], r["mode"]) for r in records}
    assert cells == {(f, m) for f in audit_receiver.FAULTS for m in audit_receiver.MODES}
    # the crash waits for a cycle's first acknowledgement (once, on a loaded
    # machine, both --ack flush cycles of a cell crashed before theirs)
    for r in records:
        assert r["acked_before_fault"] > 0, r
    for r in records:
        if audit_receiver.promised(r["mode"], r["fault"]):
            assert r["commit_records"] >= r["acked_before_fault"], r
    # what --ack write and --ack receive acknowledged without an fsync is lost with the page cache
    for mode in ("write", "receive"):
        assert sum(r["acked_lost"] for r in records if r["mode"] == mode and r["fault"] == "receiver-power") > 0


def test_short_receiver_audit_patched(pg_bin, tmp_path):
    _short_receiver_audit(pg_bin, tmp_path)


def test_short_receiver_audit_stock(stock_bin, tmp_path):
    _short_receiver_audit(stock_bin, tmp_path)
