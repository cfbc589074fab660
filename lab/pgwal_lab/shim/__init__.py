"""Build and configure the LD_PRELOAD fsync/pwrite latency shim."""
from __future__ import annotations

import subprocess
from pathlib import Path

import os

from ..util import BUILD_DIR, LabError, workdir

SOURCE = Path(__file__).resolve().parent / "pgwal_shim.c"


def build(force: bool = False) -> Path:
    """Compile the shim with cc into lab/.build (ignored); returns the .so path."""
    d = BUILD_DIR
    probe = d if d.exists() else d.parent
    if not os.access(probe, os.W_OK):  # e.g. a non-root user on a root-owned checkout
        d = workdir() / "build"
    out = d / "pgwal_shim.so"
    if not force and out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".so.tmp")
    p = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-Wall", "-o", str(tmp), str(SOURCE), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise LabError(f"building the shim failed:\n{p.stderr}")
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def env(fsync_us: float = 0, pwrite_us: float = 0, pwrite_us_per_mb: float = 0, match: str = "") -> dict:
    """Environment that makes a process (and its children) load the shim."""
    if not (fsync_us or pwrite_us or pwrite_us_per_mb):
        return {}
    return {
        "LD_PRELOAD": str(build()),
        "PGWAL_SHIM_FSYNC_US": str(int(fsync_us)),
        "PGWAL_SHIM_PWRITE_US": str(int(pwrite_us)),
        "PGWAL_SHIM_PWRITE_US_PER_MB": str(int(pwrite_us_per_mb)),
        "PGWAL_SHIM_MATCH": match,
    }
