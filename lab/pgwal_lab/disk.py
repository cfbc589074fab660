"""Per-node disks and named latency profiles.

When root, each node gets its own ext4 file system on a loop device backed by
a file in /dev/shm (tmpfs), so nodes don't share a journal and the base
fdatasync cost is small and repeatable (~30 us here).  Otherwise a plain
directory is used.  Latency on top comes from the LD_PRELOAD shim.

Profiles (what they emulate):
  tmpfs  no added latency: the raw loop-on-tmpfs device (~30 us fdatasync).
  nvme   +50 us per fsync/fdatasync: a datacenter NVMe drive with power-loss
         protection, whose flush is cheap.
  ssd    +200 us per fsync/fdatasync: a SATA/consumer SSD flushing its cache.
  hdd    +8 ms per fsync/fdatasync (one rotation + seek) and slow writes:
         +50 us per pwrite plus 6.5 ms per MiB (~150 MiB/s sequential), the
         cost a 7200 rpm disk shows under dirty-page pressure.
  slow-write  +2 ms per fsync and +0.3 ms per pwrite: a standby whose WAL
         writes and flushes are slow (the remote_receive case).
A profile applies to every fd unless `match` narrows it (e.g. "pg_wal").
Custom: "fsync=1000,pwrite=0,permb=0,match=pg_wal" (microseconds).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from . import shim
from .util import PREFIX, LabError, chown_to_pg, is_root, run


@dataclass(frozen=True)
class DiskProfile:
    name: str
    fsync_us: float = 0
    pwrite_us: float = 0
    pwrite_us_per_mb: float = 0
    match: str = ""

    def env(self) -> dict:
        return shim.env(self.fsync_us, self.pwrite_us, self.pwrite_us_per_mb, self.match)

    def asdict(self) -> dict:
        return asdict(self)


PROFILES = {
    "tmpfs": DiskProfile("tmpfs"),
    "nvme": DiskProfile("nvme", fsync_us=50),
    "ssd": DiskProfile("ssd", fsync_us=200),
    "hdd": DiskProfile("hdd", fsync_us=8000, pwrite_us=50, pwrite_us_per_mb=6500),
    "slow-write": DiskProfile("slow-write", fsync_us=2000, pwrite_us=300),
}


def profile(spec: str | DiskProfile | None) -> DiskProfile:
    """A profile by name, or custom 'fsync=US,pwrite=US,permb=US,match=S'."""
    if isinstance(spec, DiskProfile):
        return spec
    if not spec:
        return PROFILES["tmpfs"]
    if spec in PROFILES:
        return PROFILES[spec]
    kw = {}
    keys = {"fsync": "fsync_us", "pwrite": "pwrite_us", "permb": "pwrite_us_per_mb", "match": "match"}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        if k not in keys:
            raise LabError(f"unknown disk profile {spec!r} (known: {', '.join(PROFILES)})")
        kw[keys[k]] = v if k == "match" else float(v)
    return DiskProfile(spec, **kw)


class Disk:
    """A node's storage: ext4 on a tmpfs-backed loop device (root) or a directory."""

    def __init__(self, tag: str, mountpoint: Path, size_mb: int = 4096):
        self.tag = tag
        self.mountpoint = mountpoint
        self.size_mb = size_mb
        self.image: Path | None = None
        self.loopdev: str | None = None
        self.mounted = False

    def create(self) -> Path:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if is_root() and os.environ.get("PGWAL_LAB_NO_LOOP") != "1":
            self.image = Path("/dev/shm") / f"{PREFIX}-lab-{self.tag}.img"
            run(["truncate", "-s", f"{self.size_mb}M", self.image])
            self.loopdev = run(["losetup", "-f", "--show", self.image]).stdout.strip()
            run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loopdev], timeout=120)
            run(["mount", "-o", "noatime", self.loopdev, self.mountpoint])
            self.mounted = True
        chown_to_pg(self.mountpoint)
        return self.mountpoint

    def destroy(self) -> None:
        if self.mounted:
            run(["umount", "-l", self.mountpoint], check=False)
            self.mounted = False
        if self.loopdev:
            run(["losetup", "-d", self.loopdev], check=False)
            self.loopdev = None
        if self.image:
            self.image.unlink(missing_ok=True)
            self.image = None


def leftover_loops() -> list[tuple[str, str]]:
    """(device, backing file) of loop devices backed by lab images."""
    out = run(["losetup", "-a"], check=False).stdout or ""
    res = []
    for line in out.splitlines():
        m = re.match(r"(/dev/loop\d+):.*\((.*)\)", line)
        if m and f"{PREFIX}-lab-" in m.group(2):
            res.append((m.group(1), m.group(2)))
    return res
