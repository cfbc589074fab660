"""`pgwal-lab run sync-modes --cluster FILE` on an existing cluster, reached
only by its DSNs: a lab-made cluster in network namespaces stands in for a
user's, and the lab runs inside the primary's namespace, reaching the
primary at 127.0.0.1 and the standby over the veth at its own address, as
a client on the primary's host would.  The lab changes only the allowed
settings and puts every one back, also when refused or interrupted."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgwal_lab import external, topology
from pgwal_lab.util import LAB_DIR, LabError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def auto_conf(node) -> dict:
    """What postgresql.auto.conf holds (the lab restores exactly this)."""
    return dict(node.sql("SELECT name, setting FROM pg_file_settings "
                         "WHERE sourcefile LIKE '%%postgresql.auto.conf' ORDER BY seqno"))


def write_conf(tmp_path, cluster, pg_bin, may_change, name="cluster.toml") -> Path:
    s1 = cluster.nodes["s1"]
    f = tmp_path / name
    f.write_text(f"""
[primary]
dsn = "host=127.0.0.1 port={cluster.primary.port} user=postgres dbname=postgres"

[[standbys]]
name = "s1"
dsn = "host={topology.SUBNET}.{s1.index}.2 port={s1.port} user=postgres dbname=postgres"

[client]
bin_dir = "{pg_bin}"

[settings]
may_change = {json.dumps(may_change)}
""")
    return f


def lab_in_primary_ns(cluster, args, **kw) -> subprocess.Popen:
    """The lab CLI as a process in the primary's namespace (nothing but the DSNs to go by)."""
    env = dict(os.environ, PYTHONPATH=str(LAB_DIR))
    return subprocess.Popen(["ip", "netns", "exec", cluster.primary.netns, sys.executable, "-m", "pgwal_lab",
                             *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kw)


@pytest.fixture(scope="module")
def user_cluster(pg_bin):
    spec = topology.simple_spec(pg_bin, standbys=1, sync=True)
    with topology.Cluster(spec) as c:
        # a user's own choice, which the lab must put back as it was
        c.primary.sql("ALTER SYSTEM SET synchronous_commit = 'remote_write'")
        c.primary.sql("SELECT pg_reload_conf()")
        yield c


ALL = ["synchronous_commit", "wal_receiver_flush_worker", "wal_receiver_reply_events"]


@needs_root
def test_sync_modes_on_an_existing_cluster(user_cluster, pg_bin, tmp_path):
    c = user_cluster
    before = {n: auto_conf(c.nodes[n]) for n in ("primary", "s1")}
    conf = write_conf(tmp_path, c, pg_bin, ALL)
    out = tmp_path / "results"
    p = lab_in_primary_ns(c, ["run", "sync-modes", "--cluster", conf, "--smoke", "--results", out, "--no-print"])
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    recs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    levels = {r["variant"] for r in recs}
    assert {"off", "local", "remote_write", "on", "remote_apply"} <= levels
    for r in recs:
        assert r["proof"]["external"] is True and r["topology"].startswith("existing cluster")
        assert r["group"] == "existing" and r["metrics"]["tps"] > 0
        # another machine's processes are not read from this one's /proc
        assert r["metrics"]["walsender_cpu_s"] is None
    if recs[0]["proof"]["build"]["patched"]:
        assert {"remote_receive", "remote_receive+fw", "on+fw"} <= levels
        fw = {r["variant"]: r["proof"]["standby_settings"]["s1"]["wal_receiver_flush_worker"] for r in recs}
        assert fw["on+fw"] == "on" and fw["on"] == "off"
        # the lab leaves a user's reply events alone unless asked (the server's default here)
        assert recs[0]["proof"]["standby_settings"]["s1"]["wal_receiver_reply_events"] == "write, flush"
    assert "## sync-modes" in (out / "report.md").read_text()
    assert "restored settings" in stderr
    after = {n: auto_conf(c.nodes[n]) for n in ("primary", "s1")}
    assert after == before
    assert c.primary.scalar("SHOW synchronous_commit") == "remote_write"


@needs_root
def test_refuses_a_setting_it_may_not_change(user_cluster, pg_bin, tmp_path):
    c = user_cluster
    if c.nodes["s1"].scalar("SELECT count(*) FROM pg_settings WHERE name = 'wal_receiver_flush_worker'") == 0:
        pytest.skip("a stock server has no flush worker to forbid")
    before = auto_conf(c.nodes["s1"])
    conf = write_conf(tmp_path, c, pg_bin, ["synchronous_commit"])
    p = lab_in_primary_ns(c, ["run", "sync-modes", "--cluster", conf, "--smoke", "--set", "flush_worker=off,on",
                              "--results", tmp_path / "r", "--no-print"])
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == 1 and "does not allow changing wal_receiver_flush_worker" in stderr, stderr[-2000:]
    assert auto_conf(c.nodes["s1"]) == before


@needs_root
def test_refuses_a_level_the_server_lacks(stock_bin, tmp_path):
    spec = topology.simple_spec(stock_bin, standbys=1, sync=True)
    with topology.Cluster(spec) as c:
        conf = write_conf(tmp_path, c, stock_bin, ALL)
        p = lab_in_primary_ns(c, ["run", "sync-modes", "--cluster", conf, "--smoke", "--set",
                                  "levels=on,remote_receive", "--results", tmp_path / "r", "--no-print"])
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 1 and "no synchronous_commit level remote_receive" in stderr, stderr[-2000:]
        assert auto_conf(c.primary) == {}


@needs_root
def test_interrupted_run_restores_settings(user_cluster, pg_bin, tmp_path):
    c = user_cluster
    before = {n: auto_conf(c.nodes[n]) for n in ("primary", "s1")}
    conf = write_conf(tmp_path, c, pg_bin, ALL)
    out = tmp_path / "results"
    p = lab_in_primary_ns(c, ["run", "sync-modes", "--cluster", conf, "--set", "scale=1", "--iterations", "3",
                              "--duration", "2", "--warmup", "0", "--settle", "0", "--quiet-wait", "0",
                              "--results", out, "--no-print"], start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "runs.jsonl").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert auto_conf(c.primary) != before["primary"]  # mid-run: the lab's level is set
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole group
        _, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, stderr[-2000:]
    assert "restored settings" in stderr
    assert {n: auto_conf(c.nodes[n]) for n in ("primary", "s1")} == before


def test_cluster_file_mistakes_are_named(tmp_path, pg_bin):
    f = tmp_path / "c.toml"
    cases = {
        "[primary]\ndsn = 'host=x'\n": "at least one [[standbys]]",
        "[primary]\ndsn = 'host=x'\n[[standbys]]\ndsn = 'host=y'\n": "name (its application_name) is required",
        "[primary]\ndsn = 'host=x'\n[[standbys]]\nname = 's1'\ndsn = 'host=y'\n[client]\nbin_dir = '/nonexistent'\n":
            "no pgbench in /nonexistent",
        "[primary]\ndsn = 'host=x'\n[mystery]\n": "unknown sections",
        "[primary\n": str(f),
    }
    for text, message in cases.items():
        f.write_text(text)
        with pytest.raises(LabError, match=re.escape(message)):
            external.load(f)
