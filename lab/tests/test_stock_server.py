"""The lab against a stock server (Debian's PostgreSQL 15): scenarios run,
levels are discovered from the server, and nothing of the patch series
(its synchronous_commit levels, its GUCs) is asked of it."""
import pytest

from pgwal_lab.cli import run_scenario

STOCK_LEVELS = {"off", "local", "remote_write", "on", "remote_apply"}


@pytest.mark.parametrize("name", ["sync-modes", "hot-counter", "wal-volume"])
def test_stock_server_smoke(name, stock_bin, tmp_path):
    records, out = run_scenario(name, stock_bin, {}, smoke=True, results=tmp_path, max_minutes=5, quiet=True)
    assert records
    assert all(r["server_version"].split(".")[0] == "15" for r in records)
    variants = {r["variant"] for r in records}
    if name == "sync-modes":
        assert variants == STOCK_LEVELS
        for r in records:
            assert r["metrics"]["tps"] > 0
            # only the level itself: no flush worker or reply-event GUCs of the series on either node
            assert r["variant_config"]["settings"] == {"synchronous_commit": r["variant"]}
            assert not r["variant_config"]["env"].get("standby_settings")
            # pg_stat_io arrived in 16: the walsender's WAL reads come from /proc instead
            assert r["metrics"]["walsender_rchar_bytes"] is not None
    elif name == "hot-counter":
        assert variants == {"on", "off"}  # local_non_durable_reads only where the server has it
        for r in records:
            assert r["metrics"]["tps"] > 0 and r["metrics"]["wal_fsyncs_per_txn"] is not None
    else:
        assert {"minimal", "replica", "logical"} <= variants
    assert f"## {name}" in (out / "report.md").read_text()
