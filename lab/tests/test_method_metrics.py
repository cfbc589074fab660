"""Unit tests (no server) for the metrics and variant plumbing added for
early lock release: level modifiers, reader variants, wait-event summaries,
WAL counter deltas."""
import pytest

from pgwal_lab.method import WaitSampler, summarize_waits, wal_counter_deltas
from pgwal_lab.scenarios.hot_counter import level_settings, matrix_variants, parse_level
from pgwal_lab.util import LabError
from pgwal_lab.workloads import counter_reader, hot_counter


def test_parse_level_modifiers():
    assert parse_level("on") == ({"synchronous_commit": "on"}, {})
    # the lab's name for local with early release (the server has no such level)
    assert parse_level("local_non_durable_reads+durable_snapshots") == (
        {"synchronous_commit": "local", "commit_early_release": "on", "durable_snapshots": "on"}, {})
    assert parse_level("local_non_durable_reads+durable_readers") == (
        {"synchronous_commit": "local", "commit_early_release": "on"}, {"durable_snapshots": "on"})
    assert parse_level("local+commit_early_release")[0]["commit_early_release"] == "on"
    with pytest.raises(LabError):
        parse_level("on+bogus")


def test_level_settings_reset_gucs_for_other_levels():
    s = level_settings(["on", "local_non_durable_reads+durable_snapshots", "off"])
    assert s["on"][0] == {"synchronous_commit": "on", "commit_early_release": "off", "durable_snapshots": "off"}
    assert s["off"][0]["durable_snapshots"] == "off"
    assert s["local_non_durable_reads+durable_snapshots"][0]["durable_snapshots"] == "on"
    # reader-only settings are not written with ALTER SYSTEM
    s = level_settings(["on", "local_non_durable_reads+durable_readers"])
    assert s["on"][0] == {"synchronous_commit": "on", "commit_early_release": "off"}


def test_matrix_variants_groups_and_readers():
    levels = ["on", "local_non_durable_reads", "local_non_durable_reads+durable_readers"]
    vs = matrix_variants(levels, [0.2, 1.0], [8, 128], [0, 4], hot_counter(), counter_reader())
    groups = {v.group for v in vs}
    assert "fsync 0.2 ms, 8 clients" in groups and "fsync 1 ms, 128 clients, 4 readers" in groups
    assert len(groups) == 8
    # durable_readers only where there are readers: 2 variants x 4 groups + 3 x 4
    assert len(vs) == 2 * 4 + 3 * 4
    dr = [v for v in vs if v.name.endswith("+durable_readers")]
    assert all(v.readers == 4 and v.reader_settings == {"durable_snapshots": "on"} for v in dr)
    assert all(v.reader_workload is None for v in vs if not v.readers)
    assert vs[0].env == {"primary_disk": "fsync=200,match=pg_wal"}
    d = dr[0].describe()
    assert d["readers"] == 4 and d["reader_workload"]["name"] == "counter-reader"


def test_matrix_variants_with_a_stock_baseline():
    """Each group runs the stock levels on the stock build first, then the
    patched levels on the patched build; names and meta say which."""
    builds = {"stock": "/s/bin", "pgwal": "/p/bin"}
    vs = matrix_variants(["on+commit_early_release"], [1.0], [128], [0], hot_counter(), None, builds, ["on", "off"])
    assert [v.name for v in vs] == ["stock:on", "stock:off", "pgwal:on+commit_early_release"]
    assert [v.env["build"] for v in vs] == ["/s/bin", "/s/bin", "/p/bin"]
    assert [v.meta["build"] for v in vs] == ["stock", "stock", "pgwal"]
    # the stock build knows no commit_early_release: its variants set only the level
    assert vs[0].settings == {"synchronous_commit": "on"}
    assert vs[2].settings == {"synchronous_commit": "on", "commit_early_release": "on"}


def test_wait_keys_and_summary():
    k = WaitSampler.key
    assert k("pgwal-writer", "active", "Lock", "transactionid") == "writer:Lock:transactionid"
    assert k("pgwal-writer", "active", None, None) == "writer:CPU"
    assert k("pgwal-reader", "idle", "Client", "ClientRead") == "reader:idle"
    assert k("psql", "active", "IO", "WalSync") == "other:IO:WalSync"
    s = summarize_waits({"writer:Lock:transactionid": 30, "writer:CPU": 10, "reader:idle": 5}, samples=10)
    assert s["wait_samples"] == 10
    assert s["writer_waits"] == {"Lock:transactionid": 0.75, "CPU": 0.25}
    assert list(s["writer_waits"]) == ["Lock:transactionid", "CPU"]  # largest first
    assert s["writer_backends_mean"] == 4.0 and s["reader_backends_mean"] == 0.5


def test_wal_counter_deltas_pg18():
    before = {"wal_records": 100.0, "wal_fpi": 10.0, "wal_bytes": 1000.0, "wal_buffers_full": 0.0,
              "io": {"client backend": {"writes": 5.0, "fsyncs": 5.0, "write_bytes": 100.0},
                     "walwriter": {"writes": 1.0, "fsyncs": 1.0, "write_bytes": 10.0}}}
    after = {"wal_records": 400.0, "wal_fpi": 12.0, "wal_bytes": 31000.0, "wal_buffers_full": 3.0,
             "io": {"client backend": {"writes": 30.0, "fsyncs": 25.0, "write_bytes": 900.0},
                    "walwriter": {"writes": 1.0, "fsyncs": 1.0, "write_bytes": 10.0},
                    "checkpointer": {"writes": 1.0, "fsyncs": 0.0, "write_bytes": 8.0}}}
    d = wal_counter_deltas(before, after, transactions=100)
    assert d["stat_wal_records"] == 300 and d["stat_wal_fpi"] == 2 and d["stat_wal_bytes"] == 30000
    assert d["stat_wal_buffers_full"] == 3
    assert d["wal_io_by_backend"] == {"client backend": {"writes": 25.0, "fsyncs": 20.0, "write_bytes": 800.0},
                                      "checkpointer": {"writes": 1.0, "fsyncs": 0.0, "write_bytes": 8.0}}
    assert d["wal_io_writes"] == 26 and d["wal_io_fsyncs"] == 20
    assert d["wal_fsyncs_per_txn"] == pytest.approx(0.2) and d["txn_per_wal_fsync"] == pytest.approx(5.0)
    assert d["wal_records_per_txn"] == pytest.approx(3.0)


def test_wal_counter_deltas_before_18_and_empty():
    d = wal_counter_deltas({"wal_records": 1.0, "wal_write": 2.0, "wal_sync": 2.0},
                           {"wal_records": 11.0, "wal_write": 12.0, "wal_sync": 7.0}, transactions=10)
    assert d["wal_io_writes"] == 10 and d["wal_io_fsyncs"] == 5 and d["wal_fsyncs_per_txn"] == 0.5
    d = wal_counter_deltas({}, {}, transactions=10)
    assert d["wal_fsyncs_per_txn"] is None and d["txn_per_wal_fsync"] is None


def test_flags_from_set_values():
    from pgwal_lab.scenarios import as_bool
    from pgwal_lab.util import LabError

    assert [as_bool(v, "x") for v in (True, "true", "on", 1, "False", "off", 0, False)] == [True] * 4 + [False] * 4
    with pytest.raises(LabError, match="vacuum"):
        as_bool("sometimes", "vacuum")


def test_fsyncs_by_backend_of_the_standby():
    from pgwal_lab.report import fsyncs_by_backend
    recs = [{"metrics": {"transactions": 100,
                         "wal_io_by_backend": {"client backend": {"fsyncs": 90.0}},
                         "standby_wal_io_by_backend": {"walreceiver": {"fsyncs": 80.0},
                                                       "background worker": {"fsyncs": 0.0}}}},
            {"metrics": {"transactions": 200,
                         "wal_io_by_backend": {"client backend": {"fsyncs": 180.0}},
                         "standby_wal_io_by_backend": {"walreceiver": {"fsyncs": 20.0},
                                                       "background worker": {"fsyncs": 100.0}}}}]
    assert fsyncs_by_backend(recs) == "client backend 0.9000"
    # the walreceiver's fsyncs (inline) and the flush worker's, per primary transaction
    assert fsyncs_by_backend(recs, "standby_wal_io_by_backend") == \
        "background worker 0.2500, walreceiver 0.4500"
    assert fsyncs_by_backend([{"metrics": {"transactions": 1}}], "standby_wal_io_by_backend") == "–"
