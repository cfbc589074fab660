"""A tiny smoke run of each scenario (seconds), plus the report."""
import os
from pathlib import Path

import pytest

from pgwal_lab import scenarios
from pgwal_lab.cli import run_scenario

from .conftest import lab_leftovers


# audits: test_audit.py; the history explorer: test_history.py
@pytest.mark.parametrize("name", [n for n in scenarios.NAMES if not n.startswith("audit") and n != "histories"])
def test_scenario_smoke(name, pg_bin, tmp_path):
    before = lab_leftovers()
    records, out = run_scenario(name, pg_bin, {}, smoke=True, results=tmp_path, max_minutes=5, quiet=True)
    assert records
    assert records[0]["machine"]["cpu_vendor"] and records[0]["machine"]["cpu_family"] is not None
    for r in records:
        m = r["metrics"]
        if name == "wal-volume":
            assert m["init_wal_bytes"] > 0 and m["oltp_wal_bytes"] > 0
            assert m["init_waldump"]["total"]["combined"] > 0
        else:
            assert m["tps"] and m["tps"] > 0
            assert m["lat_p50_ms"] is not None and m["lat_p99_ms"] >= m["lat_p50_ms"]
            assert m["wal_bytes"] > 0
            # the workload's tables are vacuumed before every run (autovacuum
            # cannot be relied on between reloads)
            assert m["vacuum_before_s"] is not None and m["vacuum_before_s"] > 0
            # WAL counters (pg_stat_wal; fsyncs from pg_stat_io on 18, pg_stat_wal before)
            assert m["stat_wal_records"] > 0 and m["wal_records_per_txn"] > 0
            assert m["wal_fsyncs_per_txn"] is not None
            assert m["wait_samples"] > 0 and m["writer_waits"]
            assert m["host_cpu_busy_pct"] is not None and m["pgbench_cpu_pct"] > 0
            assert 0 <= m["host_cpu_steal_pct"] <= 100
            if name == "sync-modes":  # lan-fast: the standby's link runs through the delay proxy
                # measured, and the proxy carried the stream; its CPU is counted in clock
                # ticks (10 ms), so a smoke run may see none
                assert m["proxy_cpu_pct"] is not None and m["proxy_cpu_pct"] >= 0
                assert m["wal_chunks_per_s"] and m["wal_chunks_per_s"] > 0
                assert m["links"]["s1"]["up_ms"] == 0.05 and m["links"]["s1"]["spin_us"] == 20
            elif name == "large-txn":  # the patched build: with and without unflushed WAL streaming
                assert r["variant_config"]["meta"]["unflushed"] in ("off", "written")
            elif name == "hot-counter":  # primary alone: no proxy to measure
                assert m["proxy_cpu_pct"] is None
                assert m["table_bytes_before"] >= 8192 and m["table_bytes_after"] >= 8192
    if name == "large-txn":
        assert sorted(r["variant"] for r in records) == ["remote_write", "remote_write+uw"]
    text = (out / "report.md").read_text()
    assert f"## {name}" in text
    assert list(out.glob("*.png"))
    assert (out / "runs.jsonl").exists()
    if name == "sync-modes":
        levels = {r["variant"] for r in records}
        assert {"local", "remote_write", "on", "remote_apply", "off"} <= levels
        from pgwal_lab import topology
        if "wal_receiver_flush_worker" in topology.server_settings_sample(pg_bin):
            # each waiting level also runs with the standby's flush worker on
            assert {"remote_write+fw", "on+fw", "remote_apply+fw"} <= levels
            assert not {"local+fw", "off+fw"} & levels
            fw = {r["variant"]: r["variant_config"]["env"]["standby_settings"] for r in records}
            assert fw["on+fw"] == {"wal_receiver_flush_worker": "on"}
            assert fw["on"] == {"wal_receiver_flush_worker": "off"}
    # nothing new left behind (another lab run may be live on this machine)
    after = lab_leftovers()
    assert all(set(after[k]) <= set(before[k]) for k in after), (before, after)


def test_hot_counter_readers_smoke(pg_bin, tmp_path):
    """Reader clients run beside the writers; with durable_snapshots (patched
    server) a '+durable_readers' level gives only the readers the setting."""
    from pgwal_lab import topology

    ds = "durable_snapshots" in topology.server_settings_sample(pg_bin)
    levels = ["on", "local_non_durable_reads+durable_readers"] if ds else ["on", "off"]
    records, out = run_scenario("hot-counter", pg_bin, {"readers": [2], "levels": levels}, smoke=True,
                                results=tmp_path, max_minutes=5, quiet=True)
    assert {r["variant"] for r in records} == set(levels)
    for r in records:
        m = r["metrics"]
        assert m["tps"] > 0 and m["read_tps"] > 0 and m["read_clients"] == 2
        assert m["read_lat_p50_ms"] is not None
        assert r["group"].endswith("2 readers")
        assert r["variant_config"]["readers"] == 2
        if r["variant"].endswith("+durable_readers"):
            assert r["variant_config"]["reader_settings"] == {"durable_snapshots": "on"}
            assert r["variant_config"]["settings"] == {"synchronous_commit": "local", "commit_early_release": "on"}
    text = (out / "report.md").read_text()
    assert "Reader clients" in text and "WAL fsyncs/txn" in text
    # vacuum=false turns the vacuum before each run off (JSON value, as with --set)
    records, _ = run_scenario("hot-counter", pg_bin, {"levels": ["off"], "vacuum": False}, smoke=True,
                              results=tmp_path / "novac", max_minutes=5, quiet=True)
    assert records and all(r["metrics"]["vacuum_before_s"] is None for r in records)
    assert records[0]["method"]["vacuum"] is False


# compares sampled hop delays (written <= replayed): flaked beside the crate tests
@pytest.mark.timing
def test_unflushed_variants_and_commit_model_smoke(pg_bin, tmp_path):
    """sync-modes pairs each waiting level with a '+uw' variant (pgbench -N
    here) and proves send_mode for each; large-txn with commit_apart times
    the COMMIT and compares it with the latency model."""
    from pgwal_lab import topology

    if "stream_unflushed_wal" not in topology.server_settings_sample(pg_bin):
        pytest.skip("this server has no stream_unflushed_wal (patch 0008)")
    records, out = run_scenario("sync-modes", pg_bin, {"workload": "simple-update", "unflushed": "off,on",
                                                        "levels": ["remote_write", "local"], "flush_worker": "off"},
                                smoke=True, results=tmp_path / "b1", max_minutes=5, quiet=True)
    assert sorted(r["variant"] for r in records) == ["local", "remote_write", "remote_write+uw"]
    for r in records:
        assert r["variant_config"]["workload"]["builtin"] == "simple-update"
        uw = r["variant_config"]["settings"].get("stream_unflushed_wal")
        assert uw == ("written" if r["variant"].endswith("+uw") else "off")
    records, out = run_scenario("large-txn", pg_bin, {"commit_apart": True, "clients": 1, "net": "1ms",
                                                      "reply_events": "receive,write,flush",
                                                      "levels": ["local", "remote_receive", "on"],
                                                      "replay_probe_ms": 5},
                                smoke=True, results=tmp_path / "b2", max_minutes=5, quiet=True)
    assert sorted(r["variant"] for r in records) == ["local", "local+uw", "on", "on+uw", "remote_receive",
                                                     "remote_receive+uw"]
    for r in records:
        m = r["metrics"]
        assert m["commit_ms"] and m["commit_ms"] > 0 and "COMMIT;" in m["statement_ms"]
        if not r["variant"].startswith("local"):
            # the commit waits at least for the proved round trip
            assert m["commit_ms"] >= 0.9 * r["proof"]["nodes"]["s1"]["link"]["rtt_ms_median"]
        # the replay probe placed the primary's flushes at every hop on the standby; the
        # standby asks for the sender flush position in both modes, so it always hears it
        assert m["flush_to_replay_error"] is None
        for hop in ("written", "flushed", "upstream_flush", "usable", "replay"):
            assert m[f"flush_to_{hop}_samples"] > 0, hop
        assert m["flush_to_written_ms_p50"] <= m["flush_to_replay_ms_p50"]
        # what stood to replay when each flush became usable, and the replay's CPU
        assert m["release_backlog_kb_p50"] is not None and m["startup_cpu_s"] is not None
        assert m["startup_runq_wait_us"] is not None and m["walreceiver_runq_wait_us"] is not None
    text = (out / "report.md").read_text()
    assert "COMMIT latency against the model" in text and "| on+uw |" in text
    assert "calibrated ms" in text and "| local | " in text and "(calibration)" in text
    assert "upstream_flush" in text


def unpatched_18() -> Path:
    """The same 18 source without the series (the stock flavour, which
    make test builds for the drop-in test), for the baseline tests."""
    from pgwal_lab.util import REPO

    stock = Path(os.environ.get("PGWAL_LAB_BASELINE_BIN", REPO / ".build/install/stock/bin"))
    if not (stock / "postgres").exists():
        if os.environ.get("PGWAL_TEST_FAST") == "1":  # make test-fast builds no unpatched server
            pytest.skip(f"no unpatched 18 build in {stock} (make test builds it)")
        pytest.fail(f"no unpatched 18 build in {stock}: server/pg test builds it (flavour stock)")
    return stock


def test_stock_baseline_interleaves_builds(pg_bin, tmp_path):
    """baseline=stock runs stock levels on the unpatched build of the same
    source and the patched levels on pgwal's, in one interleaved group on
    the same data directories, restarting before every run; each run's
    proof names the postgres it executed, and the report compares every
    patched variant with each stock one."""
    from pgwal_lab import topology

    if not topology.knows_setting(pg_bin, "wal_receiver_flush_worker"):
        pytest.skip("needs the patched server")
    stock = unpatched_18()
    records, out = run_scenario("sync-modes", pg_bin,
                                {"baseline": "stock", "baseline_bin": str(stock), "levels": ["remote_receive"],
                                 "flush_worker": "off,on", "iterations": 2},
                                smoke=True, results=tmp_path, max_minutes=8, quiet=True)
    names = ["stock:on", "stock:remote_write", "pgwal:remote_receive", "pgwal:remote_receive+fw"]
    assert [r["variant"] for r in records] == names * 2  # interleaved
    pids = set()
    for r in records:
        b = r["proof"]["build"]
        want = stock if r["variant"].startswith("stock:") else pg_bin
        assert Path(b["postgres"]) == (Path(want) / "postgres").resolve()
        assert b["patched"] == r["variant"].startswith("pgwal:")
        settings = r["proof"]["nodes"]["s1"]["settings"]
        if b["patched"]:
            # the server's default, not a lab choice
            assert settings["wal_receiver_reply_events"] == "write, flush"
            assert settings["wal_receiver_flush_worker"] == ("on" if r["variant"].endswith("+fw") else "off")
        else:
            assert settings == {}
        assert r["method"]["restart"] is True and r["metrics"]["tps"] > 0
        pids.add(r["proof"]["nodes"]["primary"]["postmaster_pid"])
    assert len(pids) == len(records)  # a fresh primary for every run
    text = (out / "report.md").read_text()
    assert "against each variant of the stock build" in text
    assert "| pgwal:remote_receive | stock:remote_write |" in text
    assert "`stock:on` stock 18" in text and "in 2 of 2 runs" in text


def test_stock_baseline_in_hot_counter_and_large_txn(pg_bin, tmp_path):
    """The baseline in the other scenarios that compare against stock:
    hot-counter (early release against stock on) and large-txn (unflushed
    streaming against stock remote_write, the patched standby accepting
    unflushed WAL only in the patched variants)."""
    from pgwal_lab import topology

    if not topology.knows_setting(pg_bin, "stream_unflushed_wal"):
        pytest.skip("needs the patched server")
    stock = unpatched_18()
    records, out = run_scenario("hot-counter", pg_bin,
                                {"baseline": "stock", "baseline_bin": str(stock), "baseline_levels": "on",
                                 "levels": "on+commit_early_release"},
                                smoke=True, results=tmp_path / "hc", max_minutes=5, quiet=True)
    assert [r["variant"] for r in records] == ["stock:on", "pgwal:on+commit_early_release"]
    assert [r["proof"]["build"]["patched"] for r in records] == [False, True]
    assert records[1]["variant_config"]["settings"]["commit_early_release"] == "on"
    records, out = run_scenario("large-txn", pg_bin,
                                {"baseline": "stock", "baseline_bin": str(stock), "clients": 2, "net": "lan"},
                                smoke=True, results=tmp_path / "lt", max_minutes=5, quiet=True)
    assert [r["variant"] for r in records] == ["stock:remote_write", "pgwal:remote_write",
                                               "pgwal:remote_write+uw"]
    for r in records:
        s1 = r["proof"]["nodes"]["s1"]["settings"]
        assert s1.get("wal_receiver_accept_unflushed") == (None if r["variant"].startswith("stock:") else "on")
        assert r["metrics"]["tps"] > 0
    assert "| pgwal:remote_write+uw | stock:remote_write |" in (out / "report.md").read_text()
