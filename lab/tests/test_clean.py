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
    assert not any(lab_leftovers().values())
    assert not c.root.exists()
    c.nodes["s1"].proxy.proc.wait(5)
