import os
import subprocess
from pathlib import Path

import pytest

from pgwal_lab import cleanup
from pgwal_lab.util import REPO, default_pg_bin, netdelay_binary


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
def bench_bin() -> Path:
    """The patched server built as the benchmarks run it (optimised, no
    assertions): $PGWAL_LAB_BENCH_BIN, which tools/test-all sets after it
    built that flavour, so there it must exist; else the checkout's."""
    env = os.environ.get("PGWAL_LAB_BENCH_BIN")
    b = Path(env) if env else REPO / ".build/install/bench/bin"
    if not (b / "postgres").exists():
        if env:
            pytest.fail(f"no postgres in {b} (PGWAL_LAB_BENCH_BIN): the bench build failed?")
        pytest.skip(f"no bench build in {b} (server/pg build --flavour bench)")
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
