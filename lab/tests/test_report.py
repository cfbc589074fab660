"""Report helpers on synthetic records (no server needed)."""
from pathlib import Path

import matplotlib
import matplotlib.figure
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pgwal_lab import report  # noqa: E402
from pgwal_lab.store import cpu_identity, cpu_label, cpu_probe_mb_s  # noqa: E402
from pgwal_lab.util import CpuTimes, cpu_share_pct, parse_cpu_times  # noqa: E402

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0xb002116

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
"""


def _rec(group, kernel, probe=None, run_id="r1"):
    machine = {"kernel": kernel, "cpus": 2, "loadavg": [0.1, 0.1, 0.1]}
    if probe:
        machine["cpu_probe_mb_s"] = probe
    return {"scenario": "hot-counter", "group": group, "variant": "on", "run_id": run_id, "machine": machine}


def test_one_machine_no_warning():
    recs = [_rec("g1", "k1", 900.0), _rec("g2", "k1", 910.0)]
    assert len(report._hosts(recs)) == 1
    assert not any("different machines" in line for line in report.machine_section(recs))


def test_two_machines_are_named_with_their_groups():
    recs = [_rec("fsync 0.2 ms, 64 clients", "k-a", run_id="a"),
            _rec("fsync 1 ms, 8 clients", "k-b", 1200.0, run_id="b"),
            _rec("fsync 1 ms, 8 clients", "k-b", 1250.0, run_id="b")]
    hosts = report._hosts(recs)
    assert hosts == ["kernel k-a: fsync 0.2 ms, 64 clients",
                     "kernel k-b, probe 1,200–1,250 MB/s: fsync 1 ms, 8 clients"]
    text = "\n".join(report.machine_section(recs))
    assert "2 invocations on 2 different machines" in text
    assert "not recorded" in text  # the first record predates the probe


def test_same_kernel_other_cpu_is_another_machine():
    zen5 = cpu_identity(CPUINFO)
    a, b = _rec("g1", "k1", 2000.0, run_id="a"), _rec("g2", "k1", 1500.0, run_id="b")
    a["machine"].update(zen5)
    b["machine"].update(zen5, cpu_family=25, cpu_model=17)
    assert report._hosts([a, b]) == ["kernel k1 (AMD family 26 model 2), probe 2,000–2,000 MB/s: g1",
                                     "kernel k1 (AMD family 25 model 17), probe 1,500–1,500 MB/s: g2"]
    assert "- cpu id: AMD family 26 model 2 stepping 1, microcode 0xb002116" in report.machine_section([a])


def test_groups_in_natural_order():
    names = ["fsync 10 ms, 8 clients", "fsync 1 ms, 32 clients", "fsync 1 ms, 8 clients", "128 clients", "all"]
    assert sorted(names, key=report._natural) == ["128 clients", "all", "fsync 1 ms, 8 clients",
                                                  "fsync 1 ms, 32 clients", "fsync 10 ms, 8 clients"]


def test_cpu_identity_reads_the_first_cpu_only():
    assert cpu_identity(CPUINFO) == {"cpu_vendor": "AuthenticAMD", "cpu_family": 26, "cpu_model": 2,
                                     "cpu_stepping": 1, "cpu_microcode": "0xb002116"}
    assert cpu_identity("") == {}
    assert cpu_label({}) is None
    assert cpu_identity(Path("/proc/cpuinfo").read_text()).get("cpu_family") is not None


def test_cpu_times_busy_and_steal():
    # user nice system idle iowait irq softirq steal guest guest_nice
    before = parse_cpu_times("cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 1 2 3\n")
    assert before == CpuTimes(busy=190.0, total=1000.0, steal=35.0)
    after = parse_cpu_times("cpu  200 0 100 1500 10 0 10 180 9 0\n")
    assert after.busy == 490.0
    assert cpu_share_pct(before, after, "busy") == pytest.approx(30.0)
    assert cpu_share_pct(before, after, "steal") == pytest.approx(14.5)
    assert cpu_share_pct(after, before, "steal") is None  # time does not run backwards
    assert cpu_share_pct(None, after, "busy") is None
    # kernels before 2.6.11 have no steal field: counted as none
    assert parse_cpu_times("cpu  1 2 3 4 5 6 7\n").steal == 0.0


def test_cpu_probe_is_positive():
    assert cpu_probe_mb_s(mib=4, rounds=1) > 0


def test_log_scale_only_for_wide_ranges():
    fig, ax = plt.subplots()
    assert report._log_scale(ax, [5000.0, 140.0]) is True
    assert ax.get_yscale() == "log"
    ax2 = fig.add_subplot(2, 1, 2)
    assert report._log_scale(ax2, [2300.0, 1900.0, 0.0]) is False
    assert ax2.get_yscale() == "linear"
    plt.close(fig)


def test_wait_until_quiet_is_bounded():
    from pgwal_lab.cli import wait_until_quiet

    waited = wait_until_quiet(0.3, poll=0.05)
    assert 0 <= waited < 1.5  # returns at once when quiet, after ~0.3 s when busy


def _hc(fsync, clients, level, tps, kernel):
    return {"scenario": "hot-counter", "group": f"fsync {fsync:g} ms, {clients} clients", "variant": level,
            "run_id": kernel, "machine": {"kernel": kernel},
            "variant_config": {"meta": {"fsync_ms": fsync, "clients": clients, "readers": 0}},
            "metrics": {"tps": tps}}


def test_clients_plot_marks_points_from_another_machine(tmp_path, monkeypatch):
    notes = []
    real_text = matplotlib.figure.Figure.text
    monkeypatch.setattr(matplotlib.figure.Figure, "text",
                        lambda self, x, y, s, **kw: notes.append(s) or real_text(self, x, y, s, **kw))
    recs = [_hc(10, c, lvl, tps + i, "k-usual" if c >= 64 else "k-other")
            for c in (8, 64, 128) for lvl, tps in (("on", 90.0), ("off", 50000.0)) for i in range(3)]
    recs += [_hc(10, 256, "on", 91.0 + i, "k-usual") for i in range(3)]
    path = report.hot_counter_plot(report.group_records(recs)["hot-counter"], tmp_path)
    assert path.exists() and path.stat().st_size > 0
    assert notes == ["hollow markers: measured on another machine (kernel k-other) than the rest (kernel k-usual)"]
    notes.clear()
    same = [r for r in recs if r["machine"]["kernel"] == "k-usual"]
    report.hot_counter_plot(report.group_records(same)["hot-counter"], tmp_path)
    assert notes == []


def test_report_heading_names_the_scenarios_unless_titled(tmp_path):
    recs = [_hc(10, 8, lvl, 100.0 + i, "k") for lvl in ("on", "off") for i in range(3)]
    text = report.render(recs, tmp_path / "a").read_text()
    assert text.splitlines()[0] == "# pgwal lab: hot-counter"
    text = report.render(recs, tmp_path / "b", title="my title").read_text()
    assert text.splitlines()[0] == "# my title"
    assert report.render([], tmp_path / "c").read_text().splitlines()[0] == "# pgwal lab report"


def test_store_reads_compressed_results(tmp_path):
    """Results kept in the repository are gzipped runs.jsonl files."""
    import gzip

    from pgwal_lab.store import Store

    recs = [{"scenario": "audit", "cycle": 1}, {"scenario": "audit", "cycle": 2}]
    plain = tmp_path / "runs.jsonl"
    for r in recs:
        Store(plain).append(r)
    packed = tmp_path / "runs.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert Store(packed).load() == Store(plain).load()
    assert [r["cycle"] for r in Store(packed).load()] == [1, 2]


def test_report_out_must_be_a_directory(tmp_path, capsys):
    """`pgwal-lab report --out report.md` used to create a directory of that name."""
    from pgwal_lab import cli

    runs = tmp_path / "runs.jsonl"
    runs.write_text("")
    assert cli.main(["report", str(runs), "--out", str(tmp_path / "report.md")]) != 0
    assert not (tmp_path / "report.md").exists()
    assert "give a directory" in capsys.readouterr().err
    assert cli.main(["report", str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.md").is_file()
