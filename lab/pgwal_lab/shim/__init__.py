"""Build and configure the LD_PRELOAD fsync/pwrite latency shim, and the
probe that shows it in effect (fsync_probe.c, used by proof.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import os

from ..util import BUILD_DIR, IN_CHECKOUT, LabError, workdir

SOURCE = Path(__file__).resolve().parent / "pgwal_shim.c"
PROBE_SOURCE = Path(__file__).resolve().parent / "fsync_probe.c"


def _compile(source: Path, name: str, flags: list[str], libs: list[str], force: bool) -> Path:
    """cc `source` into lab/.build (ignored), or the work dir where that is
    not writable (a non-root user on a root-owned checkout, an installed lab)."""
    d = BUILD_DIR
    existing = d if d.exists() else d.parent
    if not IN_CHECKOUT or not os.access(existing, os.W_OK):
        d = workdir() / "build"
    out = d / name
    if not force and out.exists() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    p = subprocess.run(["cc", "-O2", "-Wall", *flags, "-o", str(tmp), str(source), *libs],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise LabError(f"building {source.name} failed:\n{p.stderr}")
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def build(force: bool = False) -> Path:
    """The shim (.so); returns its path."""
    return _compile(SOURCE, "pgwal_shim.so", ["-shared", "-fPIC"], ["-ldl"], force)


def build_probe(force: bool = False) -> Path:
    """The fsync/pwrite timing probe (an executable); returns its path."""
    return _compile(PROBE_SOURCE, "fsync_probe", [], [], force)


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
