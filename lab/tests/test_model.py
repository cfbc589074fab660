"""The commit latency model (docs/design/unflushed-wal.md) and the COMMIT timing it is fed."""
import pytest

from pgwal_lab import model
from pgwal_lab.workloads import large_txn, parse_statement_latencies

PROOF = {"nodes": {
    "primary": {"disk": {"probe": {"pwrite_us_median": 10.0, "fdatasync_us_median": 2000.0}}},
    "s1": {"disk": {"probe": {"pwrite_us_median": 20.0, "fdatasync_us_median": 150.0}},
           "link": {"rtt_ms_median": 2.1}},
}}


def test_inputs_come_from_the_proof():
    inp = model.inputs(PROOF, reply_events="receive, write, flush")
    assert inp == {"w": 0.01, "F_p": 2.0, "rtt": 2.1, "W_s": 0.02, "F_s": 0.15, "write_reply": True}
    # the lab's default reply events have no write reply
    assert model.inputs(PROOF)["write_reply"] is False
    # no link (a primary alone) or no probe: no model
    assert model.inputs({"nodes": {"primary": PROOF["nodes"]["primary"]}}) is None
    assert model.inputs({"nodes": {**PROOF["nodes"], "s1": {"disk": {}, "link": {"rtt_ms_median": 2}}}}) is None


def test_stock_adds_the_fsync_and_unflushed_overlaps_it():
    inp = model.inputs(PROOF, reply_events="receive, write, flush")
    assert model.predict("remote_receive", False, inp) == pytest.approx(0.01 + 2.0 + 2.1)
    assert model.predict("remote_receive", True, inp) == pytest.approx(0.01 + 2.1)
    assert model.predict("remote_write", False, inp) == pytest.approx(0.01 + 2.0 + 2.1 + 0.02)
    assert model.predict("on", True, inp) == pytest.approx(0.01 + max(2.0, 2.1 + 0.17))
    # a slow primary fsync hides the whole round trip
    slow = dict(inp, F_p=10.0)
    assert model.predict("on", True, slow) == pytest.approx(0.01 + 10.0)


def test_remote_write_waits_for_the_flush_reply_without_a_write_reply():
    inp = model.inputs(PROOF)  # 'receive, flush'
    assert model.predict("remote_write", False, inp) == model.predict("on", False, inp)
    with pytest.raises(ValueError):
        model.predict("local", False, inp)


def test_calibrated_model_adds_the_measured_local_commit():
    inp = model.inputs(PROOF, reply_events="receive, write, flush")
    # local COMMIT 2.4 ms = 0.4 ms of the primary's own work + the 2 ms fsync
    assert model.predict_calibrated("remote_receive", False, inp, 2.4) == pytest.approx(2.4 + 2.1)
    assert model.predict_calibrated("remote_write", False, inp, 2.4) == pytest.approx(2.4 + 2.1 + 0.02)
    # with unflushed streaming the round trip overlaps the fsync, the 0.4 ms does not
    assert model.predict_calibrated("remote_receive", True, inp, 2.4) == pytest.approx(0.4 + 2.1)
    assert model.predict_calibrated("on", True, dict(inp, F_p=10.0), 10.4) == pytest.approx(10.4)
    # the plain model is the calibrated one with only the probe's write as the primary's work
    for level in ("remote_receive", "remote_write", "on"):
        for unflushed in (False, True):
            assert model.predict_calibrated(level, unflushed, inp, 0.01 + 2.0) == pytest.approx(
                model.predict(level, unflushed, inp))


def test_report_shows_the_calibrated_model_when_the_group_ran_local():
    from pgwal_lab.report import commit_model_section

    def recs(level, unflushed, commit_ms):
        return [{"metrics": {"commit_ms": c}, "proof": PROOF, "params": {"reply_events": "receive,write,flush"},
                 "variant_config": {"meta": {"level": level, "unflushed": unflushed}}} for c in commit_ms]

    variants = {"local": recs("local", "off", [2.4, 2.5, 2.3]),
                "local+uw": recs("local", "written", [2.5, 2.5]),
                "remote_receive": recs("remote_receive", "off", [4.5, 4.6]),
                "remote_receive+uw": recs("remote_receive", "written", [2.6, 2.6])}
    text = "\n".join(commit_model_section(variants))
    assert "calibrated ms" in text
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ")}
    assert rows["local"][-3] == "(calibration)"
    # plain model 4.11, calibrated 2.4 + 2.1 = 4.50: the 0.44 ms miss becomes -0.05
    assert rows["remote_receive"][2:6] == ["4.11", "+0.44", "+10.7", "yes"]
    assert rows["remote_receive"][-3:] == ["4.50", "+0.05", "yes"]
    # +uw calibrates with local+uw: 2.5 - 2.0 + 2.1
    assert rows["remote_receive+uw"][-3:] == ["2.60", "+0.00", "yes"]
    # without a local variant the section has no calibrated columns
    del variants["local"], variants["local+uw"]
    assert "calibrated" not in "\n".join(commit_model_section(variants))


def test_fits_is_relative_or_absolute_whichever_is_wider():
    assert model.fits(11.4, 10.0) and not model.fits(11.6, 10.0)
    assert model.fits(1.29, 1.0) and not model.fits(1.31, 1.0)  # ±0.3 ms beats 15 % of 1 ms


def test_commit_apart_times_the_commit():
    wl = large_txn(rows=2, tables=2, commit_apart=True)
    assert wl.per_command and wl.script.splitlines()[1:] == [
        "BEGIN;", wl.script.splitlines()[2], "COMMIT;"]
    assert not large_txn(rows=2, tables=2).per_command
    out = """tps = 426.1 (without initial connection time)
statement latencies in milliseconds and failures:
         0.001           0  \\set t random(0, 1)
         0.061           0  BEGIN;
         1.234           0  INSERT INTO large_:t (payload) SELECT 1;
         2.345           0  COMMIT;
"""
    assert parse_statement_latencies(out) == {"\\set t random(0, 1)": 0.001, "BEGIN;": 0.061,
                                              "INSERT INTO large_:t (payload) SELECT 1;": 1.234, "COMMIT;": 2.345}
    assert parse_statement_latencies("tps = 1\n") == {}


def test_usable_is_the_local_flush_capped_by_the_heard_primary_flush():
    from pgwal_lab.replay_delay import HOPS, hop_positions

    # written, flushed, upstream_flush, replay
    got = dict(zip(HOPS, hop_positions((900, 800, 700, 600))))
    assert got == {"written": 900, "flushed": 800, "upstream_flush": 700, "usable": 700, "replay": 600}
    assert dict(zip(HOPS, hop_positions((900, 800, 850, 600))))["usable"] == 800
    # a stream without the sender flush position: the local flush is usable
    got = dict(zip(HOPS, hop_positions((900, 800, None, 600))))
    assert got["usable"] == 800 and got["upstream_flush"] == float("-inf")


def test_release_backlog_is_what_was_left_to_replay_when_a_flush_became_usable():
    from pgwal_lab.replay_delay import replay_backlog

    primary = [(0.000, 10_000), (0.012, 30_000), (0.030, 99_000)]
    usable = [(0.005, 10_240), (0.010, 10_240), (0.015, 30_720), (0.020, 30_720)]
    replay = [(0.005, 0), (0.010, 10_240), (0.015, 20_480), (0.020, 30_720)]
    got = replay_backlog(primary, usable, replay)
    # 10000 usable at 0.005 with nothing replayed; 30000 usable at 0.015 with 20480 replayed;
    # 99000 never usable
    assert got["release_backlog_kb_p50"] == pytest.approx((10_000 / 1024 + (30_000 - 20_480) / 1024) / 2)
    # backlogs over the standby samples: 10, 0, 10, 0 kB
    assert got["replay_backlog_kb_p50"] == pytest.approx(5.0)
    assert replay_backlog([], [], [])["release_backlog_kb_p50"] is None


def test_run_queue_wait_is_the_mean_wait_per_run_of_a_process():
    import os

    from pgwal_lab.util import proc_schedstat, run_queue_wait_us

    assert run_queue_wait_us((1_000_000, 10), (4_000_000, 13)) == pytest.approx(1000.0)
    assert run_queue_wait_us((1_000_000, 10), (1_000_000, 10)) is None  # it never ran
    assert run_queue_wait_us(None, (1, 1)) is None
    wait_ns, runs = proc_schedstat(os.getpid())
    assert wait_ns >= 0 and runs > 0
    assert proc_schedstat(2 ** 22 + 1) is None  # beyond pid_max: no such process


def test_replay_delay_pairs_each_flush_with_the_first_replay_that_covers_it():
    from pgwal_lab.replay_delay import delays

    primary = [(0.0, 100), (1.0, 200), (2.0, 300), (3.0, 400)]
    standby = [(0.5, 100), (1.2, 150), (1.5, 200), (2.1, 300), (2.9, 350)]
    assert list(delays(primary, standby)) == pytest.approx([0.5, 0.5, 0.1])  # 400 never replayed
    # a standby sample before the flush sample does not count, even if it covers it
    assert list(delays([(1.0, 100)], [(0.9, 100), (1.1, 100)])) == pytest.approx([0.1])
    assert delays([], standby).size == 0
