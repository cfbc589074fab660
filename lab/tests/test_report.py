"""Report helpers on synthetic records (no server needed)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pgwal_lab import report  # noqa: E402
from pgwal_lab.store import cpu_probe_mb_s  # noqa: E402


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
