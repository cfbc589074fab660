"""Emulated power loss: a volatile page cache over a node's data directory.

With `volatile_env()` in its environment, the shim (shim/pgwal_shim.c)
records before every write to a file under the data directory what the
write replaces, in an undo log per file; an fsync/fdatasync of the file
empties its log.  After every server process was SIGKILLed, `undo()`
applies the logs backwards: each file is as it was at its last sync, as
after an OS crash that lost the page cache.  Metadata (creation, rename,
unlink, truncation) counts as durable at once, and no page is ever torn.

`self_test()` shows the mode in effect on a node's own file system, as its
server user, before anything is audited: a write without fsync must vanish,
a synced write must stay.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import struct
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from . import shim
from .util import LabError, chown_to_pg

FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long)
UNDO_MAGIC = 0x554E444F
HEADER = struct.Struct("<IIQQQQ")  # magic, pad, offset, length, old_size, saved


def volatile_env(log_dir: Path, datadir: Path) -> dict:
    """Environment that makes a server's writes under `datadir` volatile."""
    return {"LD_PRELOAD": str(shim.build()), "PGWAL_SHIM_VOLATILE_DIR": str(log_dir),
            "PGWAL_SHIM_VOLATILE_MATCH": os.path.realpath(datadir) + "/"}


def prepare(log_dir: Path) -> None:
    """An empty undo log directory the server user can write."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for p in log_dir.iterdir():
        p.unlink()
    chown_to_pg(log_dir)


def write_back(log_dir: Path) -> int:
    """The OS wrote its whole page cache back: every write made so far is
    durable.  Each undo log is emptied under the lock the shim holds while
    it records, so a write recorded meanwhile is kept (it comes after).
    Safe while the server runs; returns how many logs held writes."""
    n = 0
    for p in log_dir.glob("*.undo"):
        try:
            fd = os.open(p, os.O_WRONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size:
                os.ftruncate(fd, 0)
                n += 1
        finally:
            os.close(fd)
    return n


def _generation(fd: int) -> int:
    try:
        return struct.unpack("<q", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8)))[0] & 0xFFFFFFFF
    except OSError:
        return 0


def _files_by_identity(roots: list[Path]) -> dict[tuple[int, int, int], str]:
    """(device, inode, generation) -> path of every regular file under roots."""
    out = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                p = os.path.join(dirpath, n)
                try:
                    st = os.lstat(p)
                    if not (st.st_mode & 0o170000) == 0o100000:
                        continue
                    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    out[(st.st_dev, st.st_ino, _generation(fd))] = p
                finally:
                    os.close(fd)
    return out


def read_log(path: Path) -> list[tuple[int, int, int, bytes]]:
    """Entries (offset, length, old_size, old bytes) of one undo log, oldest
    first.  A torn last entry (the writer was killed while appending it, so
    its write never happened) is left out."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + HEADER.size <= len(data):
        magic, _, off, length, old_size, saved = HEADER.unpack_from(data, pos)
        if magic != UNDO_MAGIC:
            raise LabError(f"undo log {path} is corrupt at byte {pos}")
        end = pos + HEADER.size + saved
        if end > len(data):
            break
        out.append((off, length, old_size, data[pos + HEADER.size:end]))
        pos = end
    return out


@dataclass
class UndoStats:
    files: int = 0          # files that lost writes
    writes: int = 0         # writes undone
    bytes: int = 0          # bytes those writes had written
    orphans: int = 0        # logs of files that no longer exist (unlinked)

    def asdict(self) -> dict:
        return dict(self.__dict__)


def undo(log_dir: Path, roots: list[Path]) -> UndoStats:
    """Lose every write not synced since it was made.  Call only when no
    process that loads the shim with this log_dir is alive."""
    failed = log_dir / "FAILED"
    if failed.exists():
        raise LabError(f"the volatile page cache did not record every write:\n{failed.read_text()}")
    logs = sorted(log_dir.glob("*.undo"))
    stats = UndoStats()
    if not logs:
        return stats
    files = _files_by_identity(roots)
    for log in logs:
        entries = read_log(log)
        if entries:
            dev, ino, gen = (int(x, 16) for x in log.name[:-5].split("-"))
            path = files.get((dev, ino, gen))
            if path is None:
                stats.orphans += 1
            else:
                stats.files += 1
                fd = os.open(path, os.O_WRONLY)
                try:
                    for off, length, old_size, old in reversed(entries):
                        if old:
                            os.pwrite(fd, old, off)
                        if os.fstat(fd).st_size > old_size:
                            os.ftruncate(fd, old_size)
                        stats.writes += 1
                        stats.bytes += length
                    os.fsync(fd)
                finally:
                    os.close(fd)
        log.unlink()
    return stats


# Run as the server user with the node's environment: what a server's
# writes go through.  Writes A and syncs it, overwrites half of it with B and
# appends C without a sync; a second file is written and synced.
_PROBE = textwrap.dedent("""
    import os, sys
    d = sys.argv[1]
    fd = os.open(os.path.join(d, "volatile_probe_1"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.pwrite(fd, b"A" * 8192, 0)
    os.fsync(fd)
    os.pwrite(fd, b"B" * 4096, 0)
    os.lseek(fd, 0, os.SEEK_END)
    os.write(fd, b"C" * 8192)
    fd2 = os.open(os.path.join(d, "volatile_probe_2"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd2, b"D" * 100)
    os.fdatasync(fd2)
""")


def _reachable_by_others(path: str) -> bool:
    """Whether any user may execute `path`: the file and every directory
    above it carry the "others" execute bit."""
    p = Path(os.path.realpath(path))
    if not p.is_file() or not p.stat().st_mode & 0o001:
        return False
    return all(d.stat().st_mode & 0o001 for d in p.parents)


def _python_for_others() -> str:
    """A Python interpreter the server user can run.  Root's own may live
    under a 0700 home (a pyenv shim, or the lab's venv made from one), so
    the system's comes first."""
    found = [shutil.which("python3"), sys.executable]
    for cand in ["/usr/bin/python3", "/usr/local/bin/python3", *filter(None, found)]:
        if _reachable_by_others(cand):
            return os.path.realpath(cand)
    raise LabError("volatile page cache self-test: no Python interpreter the server user may run "
                   "(install the system's python3)")


def self_test(log_dir: Path, datadir: Path, run_as_pg) -> None:
    """Show on the node's own file system, as its server user, that a write
    without a sync is lost by undo() and a synced one is kept; raise if not."""
    probe_dir = datadir / "pgwal_volatile_probe"
    probe_dir.mkdir(exist_ok=True)
    chown_to_pg(probe_dir)
    try:
        run_as_pg([_python_for_others(), "-c", _PROBE, str(probe_dir)])
        f1, f2 = probe_dir / "volatile_probe_1", probe_dir / "volatile_probe_2"
        before = (f1.read_bytes(), f2.read_bytes())
        if before != (b"B" * 4096 + b"A" * 4096 + b"C" * 8192, b"D" * 100):
            raise LabError("volatile page cache self-test: the probe's writes did not happen")
        stats = undo(log_dir, [probe_dir])
        after = (f1.read_bytes(), f2.read_bytes())
        if after != (b"A" * 8192, b"D" * 100) or stats.writes != 2:
            raise LabError("volatile page cache not in effect: after the emulated power loss the probe file "
                           f"holds {len(after[0])} bytes ({after[0][:1]!r}..., {stats.writes} writes undone), "
                           "expected exactly the 8192 synced bytes 'A'; the synced file holds "
                           f"{len(after[1])} bytes")
    finally:
        for p in probe_dir.glob("*"):
            p.unlink()
        probe_dir.rmdir()
