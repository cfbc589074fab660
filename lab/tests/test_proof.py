"""The lab proves a run's environment before measuring it (proof.py), and
refuses when a label is not in effect: a shim the server user cannot load,
a link that bypasses or does not delay, another build than the bin dir's."""
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from pgwal_lab import cli, netem, proof, shim, topology
from pgwal_lab.util import run


@pytest.mark.timing  # an upper bound on the unshimmed path's latency
def test_probe_shows_shim_latency_only_where_it_applies(tmp_path):
    probe = shim.build_probe(force=True)
    target = tmp_path / "pg_wal"
    target.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(shim.build()), PGWAL_SHIM_FSYNC_US="1000", PGWAL_SHIM_PWRITE_US="300",
               PGWAL_SHIM_MATCH="pg_wal")

    def times(path):
        return json.loads(run([probe, path, 10, 8192], env=env).stdout)

    slow, other = times(target / "f"), times(tmp_path / "f")
    assert slow["fdatasync_us_min"] >= 1000 and slow["pwrite_us_min"] >= 300
    assert other["fdatasync_us_min"] < 1000 and other["pwrite_us_min"] < 300


@pytest.fixture(scope="module")
def pair(pg_bin):
    spec = topology.ClusterSpec(bin_dir=pg_bin, primary_disk="ssd",
                                standbys=[topology.StandbySpec("s1", sync=True, net="lan", disk="nvme")])
    with topology.Cluster(spec) as c:
        yield c


def test_proof_of_a_cluster_as_labelled(pair):
    p = pair.prove()
    assert p["build"]["postgres"] == str((pair.spec.bin_dir / "postgres").resolve())
    disk = p["nodes"]["primary"]["disk"]
    assert disk["profile"] == "ssd" and disk["probe"]["fdatasync_us_min"] >= 200
    s1 = p["nodes"]["s1"]
    assert s1["disk"]["probe"]["fdatasync_us_min"] >= 50
    assert s1["link"]["proxy"] and s1["link"]["rtt_ms_min"] >= 0.1
    assert "primary: disk ssd" in proof.summary(p)


def test_link_label_without_its_proxy_is_refused(pair):
    s1 = pair.nodes["s1"]
    real = s1.net_profile
    try:
        # the walreceiver still streams through the 0.05 ms proxy; a 1 ms label is false
        s1.net_profile = netem.profile("1ms")
        with pytest.raises(proof.ProofError, match="delays a round trip by 2 ms"):
            proof.prove_link(s1)
        proxy, s1.proxy = s1.proxy, None
        try:
            with pytest.raises(proof.ProofError, match="needs a delay proxy"):
                proof.prove_link(s1)
            # labelled "no delay" while streaming through a proxy
            s1.net_profile = netem.profile("none")
            with pytest.raises(proof.ProofError, match="walreceiver streams from 127.0.0.1"):
                proof.prove_link(s1)
        finally:
            s1.proxy = proxy
    finally:
        s1.net_profile = real
    assert proof.prove_link(s1)["proxy"]


def test_another_build_than_the_bin_dir_is_refused(pair, tmp_path, monkeypatch):
    # a bin dir whose postgres is another program than the one running
    other = tmp_path / "bin"
    other.mkdir()
    shutil.copy("/bin/true", other / "postgres")
    real = pair.spec.bin_dir
    try:
        pair.spec.bin_dir = other
        with pytest.raises(proof.ProofError, match="the postmaster executes"):
            proof.prove_build(pair)
    finally:
        pair.spec.bin_dir = real
    if proof.prove_build(pair)["patched"]:
        return
    # a stock server under a bin dir that claims the patched series
    monkeypatch.setattr(proof, "read_build_info", lambda _bin: {"flavour": "check"})
    with pytest.raises(proof.ProofError, match="does not know synchronous_commit = remote_receive"):
        proof.prove_build(pair)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a directory the server user cannot enter")
def test_a_shim_the_server_cannot_load_is_refused(pg_bin, monkeypatch):
    """The dynamic loader skips an LD_PRELOAD it cannot open without failing:
    the server starts, and only the proof notices that the disk is not slow."""
    hidden = Path(tempfile.mkdtemp(prefix="pgwal-hidden-"))  # 0700, root's
    try:
        so = hidden / "pgwal_shim.so"
        shutil.copy(shim.build(), so)
        assert stat.S_IMODE(hidden.stat().st_mode) == 0o700
        monkeypatch.setattr(shim, "build", lambda force=False: so)
        proof._probe_cache.clear()
        spec = topology.ClusterSpec(bin_dir=pg_bin, primary_disk="fsync=1000,match=pg_wal")
        with topology.Cluster(spec) as c:
            with pytest.raises(proof.ProofError, match="has not loaded"):
                c.prove()
    finally:
        proof._probe_cache.clear()
        shutil.rmtree(hidden, ignore_errors=True)


def test_demo_refuses_a_stock_server_unless_asked(stock_bin, capsys):
    assert cli.main(["demo", "--bin", str(stock_bin)]) == 1
    assert "--allow-stock" in capsys.readouterr().err
