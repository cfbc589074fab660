"""Network emulation: wraps the pgwal-netdelay TCP delay proxy.

netem is not available on this kernel, so a replication link gets latency
from a userspace proxy placed between a standby and its upstream: the
standby connects to the proxy (listening on 127.0.0.1 inside the standby's
namespace) and the proxy connects to the upstream node.

Profiles (one-way delay per direction):
  none   no proxy, direct connection (loopback or veth)
  lan    0.05 ms each way (~0.1 ms RTT, same rack); 20 µs polling window
  1ms    1 ms each way (2 ms RTT, same region)
  wan20  10 ms each way (~20 ms RTT, cross-region), as in the published setups
Custom: "delay=MS[,up=MS][,down=MS][,jitter=MS][,bw=MBIT][,spin=US]"; `spin`
is the proxy's polling window before each release (default 60 µs).  The
window buys precision with CPU: at 0.05 ms every chunk falls inside it,
so `lan` uses 20 µs: on a busy machine it released as precisely as
60 µs, and under TPC-B the proxy took 35% of a core instead of 47% and
the benchmark ran 7.5% faster (lab/README.md has the measurements).
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .util import LabError, free_port, netdelay_binary, state_dir


DEFAULT_SPIN_US = 60
MAX_SPIN_US = 10_000


@dataclass(frozen=True)
class NetProfile:
    name: str
    up_ms: float = 0.0     # standby -> upstream
    down_ms: float = 0.0   # upstream -> standby
    jitter_ms: float = 0.0
    bandwidth_mbit: float = 0.0
    proxy: bool = True
    spin_us: int = DEFAULT_SPIN_US

    def asdict(self) -> dict:
        return asdict(self)


PROFILES = {
    "none": NetProfile("none", proxy=False),
    "lan": NetProfile("lan", 0.05, 0.05, spin_us=20),
    "1ms": NetProfile("1ms", 1.0, 1.0),
    "wan20": NetProfile("wan20", 10.0, 10.0),
}


def profile(spec: str | NetProfile | None) -> NetProfile:
    if isinstance(spec, NetProfile):
        return spec
    if not spec:
        return PROFILES["none"]
    if spec in PROFILES:
        return PROFILES[spec]
    d: dict = {}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        if k not in ("delay", "up", "down", "jitter", "bw", "spin"):
            raise LabError(f"unknown network profile {spec!r} (known: {', '.join(PROFILES)})")
        try:
            d[k] = float(v)
        except ValueError:
            raise LabError(f"bad network profile {spec!r}") from None
        if not math.isfinite(d[k]) or d[k] < 0:
            raise LabError(f"bad network profile {spec!r}: {k} must be a finite value >= 0")
    if "spin" in d and (d["spin"] != int(d["spin"]) or d["spin"] > MAX_SPIN_US):
        raise LabError(f"bad network profile {spec!r}: spin is whole microseconds, at most {MAX_SPIN_US}")
    kw = dict(up_ms=d.get("up", d.get("delay", 0.0)), down_ms=d.get("down", d.get("delay", 0.0)),
              jitter_ms=d.get("jitter", 0.0), bandwidth_mbit=d.get("bw", 0.0),
              spin_us=int(d.get("spin", DEFAULT_SPIN_US)))
    return NetProfile(spec, **kw)


class Proxy:
    """One running pgwal-netdelay process."""

    def __init__(self, prof: NetProfile, upstream: str, netns: str | None = None,
                 listen: str | None = None, tag: str = "proxy", spin_us: int | None = None):
        self.prof = prof
        self.upstream = upstream
        self.netns = netns
        self.listen = listen or f"127.0.0.1:{free_port()}"
        self.tag = tag
        self.spin_us = spin_us if spin_us is not None else prof.spin_us
        self.proc: subprocess.Popen | None = None
        self.pidfile = state_dir() / f"proxy-{tag}.pid"
        self.logfile: Path = state_dir() / f"proxy-{tag}.log"
        self.statsfile: Path = state_dir() / f"proxy-{tag}.stats"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def command(self) -> list[str]:
        cmd = [str(netdelay_binary()), "proxy", "--listen", self.listen, "--upstream", self.upstream,
               "--up-delay-ms", str(self.prof.up_ms), "--down-delay-ms", str(self.prof.down_ms),
               "--jitter-ms", str(self.prof.jitter_ms), "--bandwidth-mbit", str(self.prof.bandwidth_mbit),
               "--stats-file", str(self.statsfile), "--spin-us", str(self.spin_us)]
        # SCHED_FIFO when allowed: the emulated wire should not wait for CPU
        # behind the servers it connects (release p99 ~1 ms -> ~40 us here)
        cmd += ["--rt-priority", os.environ.get("PGWAL_LAB_PROXY_RT", "10" if os.geteuid() == 0 else "0")]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start(self) -> "Proxy":
        log = open(self.logfile, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.pidfile.write_text(str(self.proc.pid))
        # ready when it listens: its log line is written after bind()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"proxy exited: {self.logfile.read_text()[-500:]}")
            if "pgwal-netdelay:" in self.logfile.read_text(errors="replace"):
                return self
            time.sleep(0.02)
        raise LabError("proxy did not start")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def counters(self) -> dict | None:
        """Cumulative chunks/bytes per direction ("up" = standby -> upstream:
        status replies), refreshed by the proxy every 200 ms."""
        import json

        try:
            return json.loads(self.statsfile.read_text())
        except (OSError, ValueError):
            return None

    def lateness(self) -> list[dict]:
        """Release-lateness summaries the proxy printed (its own precision)."""
        import re

        out = []
        for m in re.finditer(r"lateness (\S+ \S+) n=(\d+) p50=(\d+)us p90=(\d+)us p99=(\d+)us max=(\d+)us",
                             self.logfile.read_text(errors="replace") if self.logfile.exists() else ""):
            out.append({"dir": m.group(1), "n": int(m.group(2)), "p50_us": int(m.group(3)),
                        "p90_us": int(m.group(4)), "p99_us": int(m.group(5)), "max_us": int(m.group(6))})
        return out

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.pidfile.unlink(missing_ok=True)
        self.statsfile.unlink(missing_ok=True)
