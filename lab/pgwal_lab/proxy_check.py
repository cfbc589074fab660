"""How precise the delay proxy is and what it costs: ping-pong round trips
through an echo server, first direct, then through a proxy with a given
one-way delay.  Used by `pgwal-lab proxy-test` (the figures in the README)
and by the proxy's tests (tests/test_netdelay.py), so both measure the
same way.

Three views of precision, because they answer different questions:
  excess     median RTT through the proxy minus 2 x delay: what a client
             sees, including the echo/ping endpoints' own wake-ups;
  lateness   the proxy's own release lateness (it timestamps each chunk
             on arrival and reports how late it sent it): its precision;
  min        never below 2 x delay, or the proxy released a chunk early.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from typing import Iterator

from . import netem
from .util import LabError, free_port, netdelay_binary, proc_cpu_seconds


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """A pgwal-netdelay echo server on loopback; yields its address."""
    addr = f"127.0.0.1:{free_port()}"
    p = subprocess.Popen([str(netdelay_binary()), "echo", "--listen", addr], start_new_session=True)
    try:
        time.sleep(0.2)
        if p.poll() is not None:
            raise LabError(f"echo server exited with {p.returncode}")
        yield addr
    finally:
        p.terminate()
        p.wait(5)


def ping(target: str, count: int, size: int = 64, max_seconds: float = 20) -> dict:
    """Round trips to `target`; pgwal-netdelay's JSON summary (us)."""
    out = subprocess.run([str(netdelay_binary()), "ping", "--target", target, "--count", str(count),
                          "--size", str(size), "--duration-s", str(max_seconds)],
                         capture_output=True, text=True, timeout=max_seconds + 40, check=True).stdout
    return json.loads(out)


def measure(echo: str, delay_ms: float, count: int | None = None, tag: str | None = None,
            spin_us: int | None = None) -> dict:
    """Ping `echo` directly, then through a fresh proxy with `delay_ms` each
    way (and a `spin_us` polling window; None = a custom link's default).  Adds
    excess_us, direct_p50_us, cpu_pct (proxy, % of one core),
    round_trips_per_s, lateness (per direction) and counters."""
    count = count or int(min(400, 2000 / max(delay_ms, 0.05)))
    base = ping(echo, count=300)
    proxy = netem.Proxy(netem.profile(f"delay={delay_ms}"), echo, tag=tag or f"check-{os.getpid()}",
                        spin_us=spin_us).start()
    try:
        cpu0 = proc_cpu_seconds(proxy.pid)
        t0 = time.monotonic()
        r = ping(f"127.0.0.1:{proxy.port}", count=count)
        wall = time.monotonic() - t0
        cpu = proc_cpu_seconds(proxy.pid) - cpu0
        time.sleep(0.2)  # the proxy reports lateness when the connection closes
        late = proxy.lateness()
        deadline = time.monotonic() + 5  # the counter file is rewritten every 200 ms
        while True:
            r["counters"] = proxy.counters()
            if (r["counters"] and r["counters"]["up_chunks"] >= r["count"]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        proxy.stop()
    r["delay_ms"] = delay_ms
    r["spin_us"] = proxy.spin_us
    r["excess_us"] = r["p50_us"] - 2 * delay_ms * 1000
    r["direct_p50_us"] = base["p50_us"]
    r["cpu_pct"] = cpu / wall * 100
    r["round_trips_per_s"] = r["count"] / wall
    r["lateness"] = late
    return r


def summary_line(r: dict) -> str:
    return (f"delay {r['delay_ms']:g} ms, spin {r['spin_us']} us: direct p50 {r['direct_p50_us']} us; "
            f"proxied p50 {r['p50_us']} us p99 {r['p99_us']} us min {r['min_us']} us; "
            f"excess over 2d {r['excess_us']:.1f} us; "
            f"proxy CPU {r['cpu_pct']:.1f}% of one core; release lateness {r['lateness']}")


def markdown(results: list[dict]) -> str:
    """One row per measured (window, delay) (RTTs in us, lateness over both directions)."""
    rows = ["| spin window | one-way delay | direct RTT p50 | proxied RTT p50 (min) / p99 "
            "| excess over 2×delay (p50) | release lateness p50 / p99 (worst direction) "
            "| proxy CPU (% of one core) | round trips/s |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        late = r["lateness"]
        lat = (f"{max(x['p50_us'] for x in late)} / {max(x['p99_us'] for x in late)} µs" if late else "n/a")
        rows.append(f"| {r['spin_us']} µs | {r['delay_ms']:g} ms | {r['direct_p50_us']} µs | "
                    f"{r['p50_us']} µs ({r['min_us']}) / {r['p99_us']} µs | {r['excess_us']:+.0f} µs | {lat} | "
                    f"{r['cpu_pct']:.1f}% | {r['round_trips_per_s']:.0f} |")
    return "\n".join(rows)
