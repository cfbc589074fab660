"""The LD_PRELOAD shim adds the configured fsync latency, measured with
pg_test_fsync (fdatasync usecs/op), only for fds whose path matches."""
import os
import shutil
from pathlib import Path

import pytest

from pgwal_lab import shim
from pgwal_lab.cli import fsync_test

TOLERANCE_US = 400  # sleep overshoot + scheduling on a loaded 2-core box


@pytest.fixture(scope="module")
def fsync_dir(tmp_path_factory):
    d = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path_factory.mktemp("fsync")
    d = d / f"pgwal-fsync-test-{os.geteuid()}"
    d.mkdir(exist_ok=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_shim_builds():
    so = shim.build(force=True)
    assert so.exists()


def test_shim_adds_fsync_latency(pg_bin, fsync_dir):
    base = fsync_test(pg_bin, "tmpfs", fsync_dir)["fdatasync_us"]
    slow = fsync_test(pg_bin, "fsync=1000,match=pgwal_fsync_test", fsync_dir)["fdatasync_us"]
    other = fsync_test(pg_bin, "fsync=1000,match=no-such-path", fsync_dir)["fdatasync_us"]
    print(f"\nfdatasync: base {base} us, +1000 us shim {slow} us, non-matching path {other} us")
    assert base is not None and slow is not None and other is not None
    assert 1000 + base * 0.5 <= slow <= 1000 + base + TOLERANCE_US
    assert other < base + TOLERANCE_US
