"""The history explorer's log and history-file verdicts (history/logscan.py,
history/cluster.py), on files written here: which log lines fail a history,
that each line is judged once, that a log a power loss cut short is read
again from its start, and that history files are compared by content."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pgwal_lab.history import verdict
from pgwal_lab.history.logscan import LogScanner, classify

QUIET = [
    "2026-12-03 06:40:01.123 UTC [123] LOG:  database system is ready to accept connections",
    "2026-12-03 06:40:02.001 UTC [130] FATAL:  could not receive data from WAL stream: server closed the connection unexpectedly",
    "2026-12-03 06:40:02.500 UTC [131] LOG:  started streaming WAL from primary at 0/3000000 on timeline 3",
    "2026-12-03 06:40:03.000 UTC [140] ERROR:  canceling statement due to user request",
]


@pytest.mark.parametrize("line,kind", [
    ("TRAP: failed Assert(\"sentPtr <= SendRqstPtr\"), File: \"walsender.c\", Line: 3210, PID: 4242", "trap"),
    ("2026-12-03 06:40:04 UTC [150] PANIC:  could not write to file \"pg_wal/xlogtemp.150\": No space left on device",
     "panic"),
    ("2026-12-03 06:40:05 UTC [100] LOG:  startup process (PID 151) was terminated by signal 6: Aborted", "signal"),
    ("2026-12-03 06:40:05 UTC [100] LOG:  terminating any other active server processes", "crash-restart"),
    ("2026-12-03 06:40:06 UTC [100] LOG:  all server processes terminated; reinitializing", "crash-restart"),
])
def test_failing_lines(line, kind):
    found, _ = classify("n2", QUIET + [line])
    assert [f.kind for f in found] == [kind]
    assert "n2" in str(found[0])


def test_quiet_log_passes_and_counts_replication_errors():
    found, repl = classify("n3", QUIET)
    assert found == []
    assert repl == 1


def _node(tmp_path, name="n1"):
    return SimpleNamespace(name=name, logfile=tmp_path / f"{name}.log")


def test_each_line_is_judged_once(tmp_path):
    n = _node(tmp_path)
    n.logfile.write_text("\n".join(QUIET) + "\n")
    s = LogScanner()
    assert s.scan([n])[0] == []
    with open(n.logfile, "a") as f:
        f.write("TRAP: failed Assert(\"false\"), File: \"x.c\", Line: 1, PID: 9\n")
    found, _ = s.scan([n])
    assert [f.kind for f in found] == ["trap"]
    assert s.scan([n])[0] == []           # read already


def test_incomplete_last_line_waits(tmp_path):
    n = _node(tmp_path)
    n.logfile.write_text(QUIET[0] + "\nTRAP: failed Ass")
    s = LogScanner()
    assert s.scan([n])[0] == []
    with open(n.logfile, "a") as f:
        f.write("ert(\"false\")\n")
    assert [f.kind for f in s.scan([n])[0]] == ["trap"]


def test_log_cut_short_by_a_power_loss_is_read_again(tmp_path):
    n = _node(tmp_path)
    n.logfile.write_text("\n".join(QUIET) + "\n")
    s = LogScanner()
    s.scan([n])
    # the unflushed tail is gone, then the server writes on
    n.logfile.write_text(QUIET[0] + "\n" + "2026-12-03 06:41:00 UTC [200] PANIC:  lost\n")
    found, _ = s.scan([n])
    assert [f.kind for f in found] == ["panic"]


def test_missing_log_is_no_finding(tmp_path):
    assert LogScanner().scan([_node(tmp_path, "n4")]) == ([], {})


def test_verdict_fails_the_step(tmp_path):
    n = _node(tmp_path, "n2")
    n.logfile.write_text("\n".join(QUIET) + "\n")
    hc = SimpleNamespace(c=SimpleNamespace(nodes={"n2": n}))
    s = LogScanner()
    assert verdict.check_logs(hc, s) == {"replication_errors": {"n2": 1}}
    with open(n.logfile, "a") as f:
        f.write("2026-12-03 06:42:00 UTC [100] LOG:  walreceiver process (PID 77) was terminated by signal 11: "
                "Segmentation fault\n")
    with pytest.raises(verdict.Failure) as e:
        verdict.check_logs(hc, s)
    assert e.value.kind == "log"
    assert "signal 11" in str(e.value)


def test_history_files_are_compared_by_content(tmp_path):
    """history_mismatches: a standby or the archive holding a history file of
    the primary's lineage with other bytes (another timeline with the same
    ID) is found; a standby that has not fetched it yet is not."""
    from pgwal_lab.history.cluster import HistoryCluster

    def node(name):
        d = tmp_path / name / "data"
        (d / "pg_wal").mkdir(parents=True)
        return SimpleNamespace(name=name, datadir=d)

    p, s1, s2 = node("n1"), node("n2"), node("n3")
    archive = tmp_path / "archive"
    archive.mkdir()
    h2 = b"1\t0/3000000\tno recovery target specified\n"
    h3 = h2 + b"\n2\t0/5000000\tcrash recovery after sending unflushed WAL\n"
    (p.datadir / "pg_wal" / "00000002.history").write_bytes(h2)
    (p.datadir / "pg_wal" / "00000003.history").write_bytes(h3)
    (s1.datadir / "pg_wal" / "00000002.history").write_bytes(h2)
    (s1.datadir / "pg_wal" / "00000003.history").write_bytes(h3)
    (archive / "00000003.history").write_bytes(h3)
    class Cluster(HistoryCluster):
        def __init__(self):  # no servers: only what history_mismatches reads
            self.archive = archive

        primary = property(lambda self: p)

        def live(self):
            return [p, s1, s2]

        def _timeline_ends(self, _p):
            return {3: 0, 2: 0x5000000, 1: 0x3000000}

    hc = Cluster()
    assert hc.history_mismatches() == []
    (s2.datadir / "pg_wal" / "00000003.history").write_bytes(
        h2 + b"\n2\t0/5000000\tno recovery target specified\n")
    (archive / "00000002.history").write_bytes(b"1\t0/2000000\tno recovery target specified\n")
    assert hc.history_mismatches() == ["the archive holds another 00000002.history than the primary",
                                       "n3 holds another 00000003.history than the primary"]


def test_full_named_segment_across_a_crash_switch_is_found(tmp_path):
    """A crash switch archives the old timeline's last segment as .partial
    only; the full name in the archive is WAL the primary may have lost.  A
    promotion's switch is not judged, nor a switch at a segment start."""
    from pgwal_lab.history.cluster import switch_segments_in, wal_file_name

    assert wal_file_name(1, 0x5000000) == "000000010000000000000005"
    assert wal_file_name(3, (1 << 32) + 0x2000010) == "000000030000000100000002"
    history = ("1\t0/5123456\tno recovery target specified\n"
               "\n2\t0/7ABCDEF\tcrash recovery after sending unflushed WAL\n"
               "\n3\t0/9000000\tcrash recovery after sending unflushed WAL\n")
    for name in ("000000010000000000000005", "000000020000000000000007.partial", "000000030000000000000009"):
        (tmp_path / name).write_bytes(b"x")
    assert switch_segments_in(history, tmp_path) == []
    (tmp_path / "000000020000000000000007").write_bytes(b"x")
    found = switch_segments_in(history, tmp_path)
    assert len(found) == 1 and found[0].startswith("000000020000000000000007 (timeline 2 left at 0/7ABCDEF")


def test_a_segment_the_cut_record_had_finished_may_be_archived_whole(tmp_path):
    """The record a crash cut started 96 bytes before the segment's end and
    ran into the next segment: writing it finished the segment, which was
    fsynced and archived before the crash, on a correct server too.  A
    record that would have ended inside the segment means the segment was
    never finished, and its full name is flagged."""
    from pgwal_lab.history.cluster import WAL_SEGMENT, switch_segments_in

    history = "1\t0/4FFFFA0\tcrash recovery after sending unflushed WAL\n"
    seg = tmp_path / "000000010000000000000004"

    def write(tot_len: int, size: int = WAL_SEGMENT) -> None:
        data = bytearray(size)
        off = 0x4FFFFA0 % WAL_SEGMENT
        if off + 4 <= size:
            data[off:off + 4] = tot_len.to_bytes(4, "little")
        seg.write_bytes(bytes(data))

    write(200)  # 96 bytes left in the segment: the record ran on
    assert switch_segments_in(history, tmp_path) == []
    write(64)  # it fitted: the segment was not finished by it
    assert len(switch_segments_in(history, tmp_path)) == 1
    write(0)  # nothing there
    assert len(switch_segments_in(history, tmp_path)) == 1
    write(200, size=WAL_SEGMENT // 2)  # not a whole segment
    assert len(switch_segments_in(history, tmp_path)) == 1


def test_coverage_matrix_counts_steps_by_fault_role_features_and_level():
    from pgwal_lab.history import report

    records = [
        {"steps": ["failover:n2@on/100/200", "power:n3@local/100/0"], "failure": {"step": 2},
         "records": [{"step": 1, "text": "failover:n2@on/100/200", "label": "failover", "role": "sync",
                      "features": "uw+accepts"},
                     {"step": 2, "text": "power:n3@local/100/0", "label": "standby-power", "role": "potential",
                      "features": "uw"}]},
        # made before steps recorded their role: derived from the label
        {"steps": ["failover:n3@on/100/0"],
         "records": [{"step": 1, "text": "failover:n3@on/100/0", "label": "failover-async"}]},
    ]
    lines = report.coverage(records)
    table = [line for line in lines if line.startswith("| failover") or line.startswith("| power")]
    assert "| failover | not sync | ? |  | 1 | 1 |" in table
    assert "| failover | sync | uw+accepts |  | 1 | 1 |" in table
    assert "| power | potential | uw | 1 ✗ |  | 1 |" in table
    assert lines[2].startswith("| fault | role | features | local | on | all |")


def test_target_state_names_role_and_features():
    from types import SimpleNamespace as NS

    from pgwal_lab.history.schedule import Step
    from pgwal_lab.history.steps import target_state

    n1 = NS(name="n1", upstream=None, conf_extra={"stream_unflushed_wal": "written"})
    n2 = NS(name="n2", upstream=n1, conf_extra={"wal_receiver_accept_unflushed": "on",
                                                 "wal_receiver_flush_worker": "on"})
    n3 = NS(name="n3", upstream=n1, conf_extra={"wal_receiver_accept_unflushed": "off"})
    n4 = NS(name="n4", upstream=n3, conf_extra={"wal_receiver_accept_unflushed": "on"})
    hc = NS(primary=n1, down=[], c=NS(nodes={n.name: n for n in (n1, n2, n3, n4)},
                                      spec=NS(settings={"wal_receiver_flush_worker": "off"})))
    assert target_state(hc, Step.parse("failover:n2@on/100/200"), "n2") == \
        {"role": "sync", "features": "uw+accepts+fw"}
    assert target_state(hc, Step.parse("power:n3@on/100/0"), "n2") == {"role": "potential", "features": "uw"}
    assert target_state(hc, Step.parse("power:n4@on/100/0"), "n2") == {"role": "cascade",
                                                                       "features": "uw+accepts"}
    assert target_state(hc, Step.parse("kill:n1@on/100/0"), "n2") == {"role": "primary", "features": "uw"}
    n1.conf_extra["stream_unflushed_wal"] = "off"
    assert target_state(hc, Step.parse("power:n3@on/100/0"), "n2")["features"] == "-"


class _Rows:
    """A connection that answers cycle_rows' two queries."""

    def __init__(self, rows, hot):
        self.rows, self.hot = rows, hot

    def execute(self, sql, params):
        if "audit_hot" in sql:
            return SimpleNamespace(fetchone=lambda: (self.hot,) if self.hot is not None else None)
        return iter(self.rows)


def test_a_commit_that_comes_back_after_its_step_fails():
    from pgwal_lab.audit.ledger import Load

    load = Load("", cycle=3, session={}, reader_kinds=[])
    assert verdict.settled_changes(load, frozenset(), 0) is None  # not settled yet: nothing to compare
    settled = [(0, 1, 0), (2, 1, 0), (2, 1, 1)]
    load.settled = verdict.cycle_rows(_Rows(settled, 5), 3)
    assert load.settled == (frozenset(settled), 5)
    assert verdict.settled_changes(load, *verdict.cycle_rows(_Rows(list(settled), 5), 3)) is None
    # an in-doubt commit the step's fault took, back after a later failover
    back = verdict.settled_changes(load, frozenset(settled + [(0, 2, 0)]), 5)
    assert back.startswith("resurrected 1 rows") and "writer 0 seq 2 part 0" in back
    assert "resurrected 0 rows and hot increments" in verdict.settled_changes(load, frozenset(settled), 6)
    # a row that was there (in doubt, so in no ledger) gone later
    gone = verdict.settled_changes(load, frozenset(settled[1:]), 5)
    assert gone.startswith("1 rows gone") and "writer 0 seq 1" in gone
    assert "hot row 5 -> 4" in verdict.settled_changes(load, frozenset(settled), 4)
    # a cycle without its hot row reads as 0
    assert verdict.cycle_rows(_Rows([], None), 3) == (frozenset(), 0)


def test_a_kill_the_step_sent_is_expected_there_and_nothing_else(tmp_path):
    n2, n3 = _node(tmp_path, "n2"), _node(tmp_path, "n3")
    reinit = [
        "2026-12-03 06:41:00 UTC [100] LOG:  WAL receiver process (PID 4242) was terminated by signal 9: Killed",
        "2026-12-03 06:41:00 UTC [100] LOG:  terminating any other active server processes",
        "2026-12-03 06:41:05 UTC [100] LOG:  checkpointer process (PID 4200) was terminated by signal 9: Killed",
        "2026-12-03 06:41:05 UTC [100] LOG:  all server processes terminated; reinitializing",
    ]
    n2.logfile.write_text("\n".join(QUIET + reinit) + "\n")
    n3.logfile.write_text("\n".join(QUIET + reinit) + "\n")
    s = LogScanner()
    s.expect_kill("n2", 4242)
    found, _ = s.scan([n2, n3])
    # on n2 the kill and the reinitialization were the step's; n3 was not hit
    assert {f.node for f in found} == {"n3"} and len(found) == 4
    # the expectation holds for one scan only, and another signal still fails
    with open(n2.logfile, "a") as f:
        f.write("2026-12-03 06:42:00 UTC [100] LOG:  startup process (PID 4300) was terminated by signal 6: "
                "Aborted\n")
    s.expect_kill("n2", 4301)
    found, _ = s.scan([n2, n3])
    assert sorted(f.kind for f in found) == ["kill-not-logged", "signal"]
    assert s.scan([n2, n3])[0] == []


def test_a_full_disk_may_panic_its_node_and_nothing_else(tmp_path):
    n1, n2 = _node(tmp_path, "n1"), _node(tmp_path, "n2")
    panic = [
        "2026-12-03 06:43:00 UTC [160] PANIC:  could not write to file \"pg_wal/xlogtemp.160\": No space left on device",
        "2026-12-03 06:43:00 UTC [100] LOG:  client backend (PID 160) was terminated by signal 6: Aborted",
        "2026-12-03 06:43:00 UTC [100] LOG:  terminating any other active server processes",
        "2026-12-03 06:43:01 UTC [100] LOG:  all server processes terminated; reinitializing",
    ]
    n1.logfile.write_text("\n".join(QUIET + panic) + "\n")
    n2.logfile.write_text("\n".join(QUIET + panic) + "\n")
    s = LogScanner()
    s.expect_disk_full("n1")
    found, _ = s.scan([n1, n2])
    assert {f.node for f in found} == {"n2"} and len(found) == 4
    # another PANIC, another signal and a TRAP still fail there, and only
    # the step's own scan expects anything
    with open(n1.logfile, "a") as f:
        f.write("2026-12-03 06:44:00 UTC [170] PANIC:  could not locate a valid checkpoint record\n"
                "2026-12-03 06:44:00 UTC [100] LOG:  startup process (PID 170) was terminated by signal 9: Killed\n"
                "TRAP: failed Assert(\"false\"), File: \"xlog.c\", Line: 1, PID: 171\n")
    s.expect_disk_full("n1")
    assert sorted(f.kind for f in s.scan([n1, n2])[0]) == ["panic", "signal", "trap"]
    with open(n1.logfile, "a") as f:
        f.write(panic[0].replace("[160]", "[180]") + "\n")
    assert [f.kind for f in s.scan([n1, n2])[0]] == ["panic"]


def test_reads_are_counted_per_reader_kind():
    from pgwal_lab.history import report

    records = [{"records": [{"reads": {"plain": 10, "standby": 4}, "reads_lost_by": {"plain": 2}},
                            {"reads": {"plain": 5, "standby": 6}}]},
               {"records": [{"text": "kill:n1@on/100/0"}]}]  # made before reads were counted
    assert report.readers(records) == ["| reader | reads | saw a commit then lost |", "|---|---|---|",
                                       "| plain | 15 | 2 |", "| standby | 10 | 0 |", ""]
    assert report.readers([{"records": [{"text": "kill:n1@on/100/0"}]}]) == []


def test_draws_favour_the_cells_run_least():
    import random
    from collections import Counter
    from types import SimpleNamespace as NS

    from pgwal_lab.history import schedule as sched
    from pgwal_lab.scenarios import histories

    n1 = NS(name="n1", upstream=None, conf_extra={"stream_unflushed_wal": "written"})
    n2 = NS(name="n2", upstream=n1, conf_extra={"wal_receiver_accept_unflushed": "on"})
    n3 = NS(name="n3", upstream=n1, conf_extra={"wal_receiver_accept_unflushed": "off"})
    n4 = NS(name="n4", upstream=n3, conf_extra={"wal_receiver_accept_unflushed": "on"})
    hc = NS(primary=n1, down=[], sync_standby=lambda: "n2",
            c=NS(nodes={n.name: n for n in (n1, n2, n3, n4)}, spec=NS(settings={})))
    st = sched.State("n1", {"n2": "n1", "n3": "n1", "n4": "n3"})
    levels = ["local", "on"]
    # one choice: exactly the seed's own draw
    assert histories.draw(random.Random(9), st, levels, hc, Counter(), 1) == \
        sched.next_step(random.Random(9), st, levels)
    # three: the candidate whose cell ran least; the first of equals
    rng = random.Random(9)
    cands = [sched.next_step(rng, st, levels) for _ in range(3)]
    cells = [histories.cell(c, histories.target_state(hc, c, "n2")) for c in cands]
    assert len(set(cells)) == 3, cells  # the seed draws three different cells
    assert histories.draw(random.Random(9), st, levels, hc, Counter({cells[0]: 5, cells[2]: 5}), 3) == cands[1]
    assert histories.draw(random.Random(9), st, levels, hc, Counter(), 3) == cands[0]
    # over many draws the cells spread: fewer repeats than unweighted draws
    def spread(choices):
        rng, cov = random.Random(4), Counter()
        for _ in range(200):
            s = histories.draw(rng, st, levels, hc, cov, choices)
            cov[histories.cell(s, histories.target_state(hc, s, "n2"))] += 1
        return max(cov.values())
    assert spread(3) < spread(1)
