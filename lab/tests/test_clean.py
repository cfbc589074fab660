"""`clean` removes what a crashed run left behind."""
import os

from pgwal_lab import cleanup, topology

from .conftest import lab_leftovers


def test_clean_removes_leftovers(pg_bin):
    spec = topology.simple_spec(pg_bin, standbys=1, net="lan")
    c = topology.Cluster(spec).create()  # "crash": never destroyed
    pids = [n.pid() for n in c.nodes.values()]
    proxy_pid = c.nodes["s1"].proxy.pid
    done = cleanup.clean(log=lambda *_: None)
    assert done
    for pid in pids + [proxy_pid]:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    left = lab_leftovers()
    assert not any(c.id in l for v in left.values() for l in v), left
    assert not c.root.exists()
    c.nodes["s1"].proxy.proc.wait(5)


def test_clean_spares_clusters_of_live_runs(pg_bin, tmp_path):
    """A cluster owned by another live process (a benchmark in progress) is left alone."""
    import json
    import subprocess
    import sys

    from pgwal_lab.util import state_dir

    c = topology.Cluster(topology.simple_spec(pg_bin, standbys=0)).create()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        st = json.loads(c.statefile.read_text())
        st["pid"] = owner.pid
        c.statefile.write_text(json.dumps(st))
        done = cleanup.clean(log=lambda *_: None)
        assert any("left cluster" in d for d in done)
        assert c.primary.scalar("SELECT 1") == 1
        assert c.statefile.exists()
    finally:
        owner.kill()
        owner.wait()
        c.destroy()
    assert not (state_dir() / f"cluster-{c.id}.json").exists()
