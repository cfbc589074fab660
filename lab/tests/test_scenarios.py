"""A tiny smoke run of each scenario (seconds), plus the report."""
import pytest

from pgwal_lab import scenarios
from pgwal_lab.cli import run_scenario

from .conftest import lab_leftovers


@pytest.mark.parametrize("name", scenarios.NAMES)
def test_scenario_smoke(name, pg_bin, tmp_path):
    before = lab_leftovers()
    records, out = run_scenario(name, pg_bin, {}, smoke=True, results=tmp_path, max_minutes=5, quiet=True)
    assert records
    for r in records:
        m = r["metrics"]
        if name == "wal-volume":
            assert m["init_wal_bytes"] > 0 and m["oltp_wal_bytes"] > 0
            assert m["init_waldump"]["total"]["combined"] > 0
        else:
            assert m["tps"] and m["tps"] > 0
            assert m["lat_p50_ms"] is not None and m["lat_p99_ms"] >= m["lat_p50_ms"]
            assert m["wal_bytes"] > 0
    text = (out / "report.md").read_text()
    assert f"## {name}" in text
    assert list(out.glob("*.png"))
    assert (out / "runs.jsonl").exists()
    if name == "sync-modes":
        levels = {r["variant"] for r in records}
        assert {"local", "remote_write", "on", "remote_apply", "off"} <= levels
    # nothing new left behind (another lab run may be live on this machine)
    after = lab_leftovers()
    assert all(set(after[k]) <= set(before[k]) for k in after), (before, after)
