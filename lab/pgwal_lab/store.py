"""Run storage: one JSON object per line, each with the full configuration,
versions and machine facts, so a report can be regenerated from it alone."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from .util import IN_CHECKOUT, REPO, netdelay_binary


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def is_busy(load: float, cpus: int | None) -> bool:
    """The lab's one definition of a busy machine: 1-minute load above half the cores."""
    return load > 0.5 * (cpus or 1)


def cpu_probe_mb_s(mib: int = 32, rounds: int = 3) -> float:
    """Single-core speed: SHA-256 throughput in MB/s, best of `rounds`.
    The model name of a VM's CPU says little (two hosts both report "AMD
    EPYC"), so every scenario records this ~0.1 s probe: runs made on
    different hosts can then be told apart before they are compared."""
    import time

    buf = bytes(range(256)) * (mib * 4096)
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        hashlib.sha256(buf).digest()
        best = max(best, len(buf) / 1e6 / (time.perf_counter() - t0))
    return round(best, 1)


def cpu_identity(cpuinfo: str) -> dict:
    """Vendor, family, model, stepping and microcode of the first CPU in
    /proc/cpuinfo text.  A VM's model name hides the generation ("AMD EPYC"
    on hosts that differed 4x in lock-heavy throughput); family and model
    do not.  Fields the text lacks are left out."""
    wanted = {"vendor_id": "cpu_vendor", "cpu family": "cpu_family", "model": "cpu_model",
              "stepping": "cpu_stepping", "microcode": "cpu_microcode"}
    out: dict = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        name = wanted.get(key.strip())
        if sep and name:
            value = value.strip()
            out[name] = int(value) if value.isdigit() else value
    return out


def cpu_label(machine: dict) -> str | None:
    """"AMD family 26 model 2" style label of a machine-facts dict, if recorded."""
    if machine.get("cpu_family") is None:
        return None
    vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(machine.get("cpu_vendor"), machine.get("cpu_vendor"))
    return f"{vendor or 'CPU'} family {machine['cpu_family']} model {machine.get('cpu_model')}"


def machine_facts() -> dict:
    cpuinfo = _read("/proc/cpuinfo")
    cpu = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines()
                if l.startswith("model name")), platform.processor())
    mem_kb = next((int(l.split()[1]) for l in _read("/proc/meminfo").splitlines() if l.startswith("MemTotal")), 0)
    commit = None
    try:
        if IN_CHECKOUT:
            commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        proxy = str(netdelay_binary())
    except Exception:
        proxy = None
    return {
        "kernel": platform.release(),
        "os": _read("/etc/os-release").split("PRETTY_NAME=")[-1].split("\n")[0].strip('"') or platform.platform(),
        "cpu": cpu,
        **cpu_identity(cpuinfo),
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 1048576, 1),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "repo_commit": commit,
        "proxy": proxy,
        "euid": os.geteuid(),
        "cpu_probe_mb_s": cpu_probe_mb_s(),
    }


class Store:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        record = dict(record)
        record.setdefault("stored_at", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def load(self) -> list[dict]:
        """The records; a `.gz` file (results kept in the repository
        compressed) is read the same way."""
        if not self.path.exists():
            return []
        if self.path.suffix == ".gz":
            import gzip

            text = gzip.decompress(self.path.read_bytes()).decode()
        else:
            text = self.path.read_text()
        return [json.loads(l) for l in text.splitlines() if l.strip()]
