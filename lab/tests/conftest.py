import os
import subprocess
from pathlib import Path

import pytest

from pgwal_lab import cleanup
from pgwal_lab.util import default_pg_bin, netdelay_binary


@pytest.fixture(scope="session")
def pg_bin() -> Path:
    b = default_pg_bin()
    assert (b / "postgres").exists(), f"no postgres in {b}"
    return b


@pytest.fixture(scope="session")
def stock_bin() -> Path:
    """A stock (unpatched) server: $PGWAL_LAB_STOCK_BIN or Debian's 15, which
    setup.sh installs when run as root."""
    b = Path(os.environ.get("PGWAL_LAB_STOCK_BIN", "/usr/lib/postgresql/15/bin"))
    if not (b / "postgres").exists():
        if os.geteuid() == 0:
            pytest.fail(f"no stock server in {b}: lab/setup.sh should have installed postgresql-15")
        pytest.skip(f"no stock server in {b} (not root, so setup.sh could not install postgresql-15)")
    return b


@pytest.fixture(scope="session")
def netdelay() -> Path:
    return netdelay_binary()


@pytest.fixture(scope="session", autouse=True)
def clean_at_end():
    yield
    cleanup.clean(log=lambda *_: None)


def lab_leftovers() -> dict:
    """Namespaces, loop devices and mounts the lab may have left."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout if os.geteuid() == 0 else ""
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout if os.geteuid() == 0 else ""
    mounts = Path("/proc/mounts").read_text()
    return {
        "netns": [l for l in ns.splitlines() if l.startswith("pgwal-")],
        "loops": [l for l in loops.splitlines() if "pgwal-lab-" in l],
        "mounts": [l for l in mounts.splitlines() if "pgwal-lab" in l],
    }
