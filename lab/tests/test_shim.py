"""The LD_PRELOAD shim adds the configured fsync latency, measured with a
probe and with pg_test_fsync (fdatasync usecs/op), only for fds whose path
matches."""
import os
import shutil
from pathlib import Path

import pytest

from pgwal_lab import shim
from pgwal_lab.cli import fsync_test

# latencies against upper bounds: run alone on the machine (tools/test-all)
pytestmark = pytest.mark.timing

TOLERANCE_US = 400  # sleep overshoot + scheduling on a loaded 2-core box

# The probes time each call and print the median: one call that waited for
# the CPU must not move the figure (a mean of 20 writes once read 2,423 us
# for a 2,000 us delay).  A delay applied twice would still be caught.


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


FSYNC_PROBE = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
times = []
for _ in range(41):
    os.pwrite(fd, b"x" * 8192, 0)
    t = time.perf_counter()
    os.fdatasync(fd)
    times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2] * 1e6)
"""


def _fdatasync_us(fsync_dir, profile: str) -> float:
    import subprocess
    import sys

    from pgwal_lab import disk

    env = dict(os.environ, **disk.profile(profile).env())
    out = subprocess.run([sys.executable, "-c", FSYNC_PROBE, str(fsync_dir / "pgwal_fsync_test.out")],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return float(out)


def test_shim_adds_fsync_latency(pg_bin, fsync_dir):
    # the probe (median of 41) for the comparisons; pg_test_fsync, which
    # `pgwal-lab fsync-test` runs (16 tests of a second each), once, with
    # the delay
    base = _fdatasync_us(fsync_dir, "tmpfs")
    slow = _fdatasync_us(fsync_dir, "fsync=1000,match=pgwal_fsync_test")
    other = _fdatasync_us(fsync_dir, "fsync=1000,match=no-such-path")
    tool = fsync_test(pg_bin, "fsync=1000,match=pgwal_fsync_test", fsync_dir)["fdatasync_us"]
    print(f"\nfdatasync (median of 41): base {base:.0f} us, +1000 us shim {slow:.0f} us, "
          f"non-matching path {other:.0f} us; pg_test_fsync with the shim {tool} us")
    assert 1000 + base * 0.5 <= slow <= 1000 + base + TOLERANCE_US
    assert other < base + TOLERANCE_US
    assert tool is not None and 1000 <= tool <= 1000 + base + TOLERANCE_US


PWRITE_PROBE = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
buf = b"x" * int(sys.argv[2])
times = []
for _ in range(21):
    t = time.perf_counter()
    os.pwrite(fd, buf, 0)
    times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2] * 1e6)
"""


def _pwrite_us(fsync_dir, profile: str, size: int) -> float:
    import subprocess
    import sys

    from pgwal_lab import disk

    env = dict(os.environ, **disk.profile(profile).env())
    out = subprocess.run([sys.executable, "-c", PWRITE_PROBE, str(fsync_dir / "pwrite_probe"), str(size)],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return float(out)


def test_shim_adds_pwrite_latency(fsync_dir):
    base = _pwrite_us(fsync_dir, "tmpfs", 8192)
    fixed = _pwrite_us(fsync_dir, "pwrite=2000", 8192)
    per_mb = _pwrite_us(fsync_dir, "permb=4000", 1 << 20)
    print(f"\npwrite 8 KiB (median of 21): base {base:.0f} us, +2000 us configured {fixed:.0f} us; "
          f"1 MiB with 4000 us/MiB {per_mb:.0f} us")
    assert 2000 <= fixed <= 2000 + base + TOLERANCE_US
    assert per_mb >= 4000


WRITE_PROBE = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
buf = b"x" * 8192
times = []
for _ in range(21):
    os.lseek(fd, 0, os.SEEK_SET)
    t = time.perf_counter()
    os.write(fd, buf)
    times.append(time.perf_counter() - t)
print(sorted(times)[len(times) // 2] * 1e6)
"""


def test_shim_delays_write_only_when_asked(fsync_dir):
    """write(2) (what pg_receivewal uses) is delayed like pwrite only with
    PGWAL_SHIM_WRITE=1, so servers' pipe and log writes stay free."""
    import subprocess
    import sys

    def write_us(extra: dict) -> float:
        env = dict(os.environ, **shim.env(pwrite_us=2000, match=str(fsync_dir)), **extra)
        return float(subprocess.run([sys.executable, "-c", WRITE_PROBE, str(fsync_dir / "write_probe")],
                                    env=env, capture_output=True, text=True, timeout=60, check=True).stdout)

    off = write_us({})
    on = write_us({"PGWAL_SHIM_WRITE": "1"})
    print(f"\nwrite 8 KiB (median of 21) with pwrite +2000 us: PGWAL_SHIM_WRITE unset {off:.0f} us, =1 {on:.0f} us")
    assert off < 1000
    assert 2000 <= on <= 2000 + off + TOLERANCE_US
