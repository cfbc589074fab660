"""A failed pgbench run says what the servers said: their PANIC, FATAL and
TRAP lines and the free space on their disks (a full pg_wal and a crash look
alike from the client)."""
from types import SimpleNamespace

from pgwal_lab.workloads import failure_context


def _node(name, datadir, log):
    return SimpleNamespace(name=name, datadir=datadir, log_tail=lambda n=30: log)


def test_lists_each_node_with_its_fatal_lines_and_free_space(tmp_path):
    log = "\n".join([
        "2026-12-02 LOG:  checkpoint starting",
        "2026-12-02 PANIC:  could not write to file \"pg_wal/xlogtemp.123\": No space left on device",
        "2026-12-02 LOG:  server process (PID 7) was terminated by signal 6: Aborted",
    ])
    primary = _node("primary", tmp_path, log)
    standby = _node("s1", tmp_path / "absent", "LOG:  started streaming")
    primary.cluster = SimpleNamespace(nodes={"primary": primary, "s1": standby})
    out = failure_context(primary)
    assert "--- primary:" in out and "MB free of" in out
    assert "No space left on device" in out and "terminated by signal 6" in out
    assert "checkpoint starting" not in out
    assert "--- s1: disk not mounted" in out
    assert "(no PANIC, FATAL or TRAP in its log)" in out


def test_nothing_for_a_cluster_the_lab_did_not_start():
    assert failure_context(SimpleNamespace(name="external")) == ""
