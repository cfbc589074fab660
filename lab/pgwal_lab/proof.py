"""Proof that the environment a run is labelled with is the one in effect.

A number under a label that was not true is worse than no number: a shim the
server user cannot read is skipped by the dynamic loader without a word, a
walreceiver may bypass its delay proxy, a bin dir may hold another build
than the one named.  So before a group's first run (and after every change
of its environment) the lab checks, and raises ProofError instead of
measuring when anything differs:

  build  every node's postmaster executes `<bin dir>/postgres`; a bin dir
         with a PGWAL-BUILD file (the patched series) must run a server
         that knows synchronous_commit = remote_receive;
  disk   a profile that adds latency: the postmaster has the shim mapped
         (/proc/PID/maps) with the profile's settings in its environment,
         and a probe run as the server user with the same environment, on
         a file in the node's file system, shows at least the configured
         fdatasync and pwrite latency; a profile without latency: no shim;
  link   the standby's walreceiver is connected through its proxy (or
         directly, without one), and a query round trip through the proxy
         takes at least the configured up + down delay.

The result is stored with every run ("proof").
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import shim
from .util import LabError, chown_to_pg, run, wait_for

PROBE_ROUNDS = 20
PROBE_BYTES = 8192
RTT_ROUNDS = 20
# clock and rounding slack below a configured latency; never above it
SLACK_US = 2.0


class ProofError(LabError):
    """The environment differs from its label: nothing is measured."""


def read_build_info(bin_dir: Path) -> dict:
    """The PGWAL-BUILD facts next to a bin dir ({} for other servers)."""
    f = Path(bin_dir).resolve().parent / "PGWAL-BUILD"
    try:
        return dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
    except OSError:
        return {}


def is_patched_bin(bin_dir: Path) -> bool:
    """Whether a bin dir holds pgwal's patched build (by its PGWAL-BUILD file)."""
    return bool(read_build_info(bin_dir))


def server_levels(node) -> list[str]:
    return list(node.scalar("SELECT enumvals FROM pg_settings WHERE name = 'synchronous_commit'") or [])


def shim_state(pid: int) -> dict:
    """Whether process `pid` has the shim mapped, and its shim environment."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as e:
        raise ProofError(f"cannot inspect process {pid}: {e}") from None
    mapped = sorted({line.split()[-1] for line in maps.splitlines() if line.endswith("/pgwal_shim.so")})
    env = {}
    for item in environ:
        k, _, v = item.decode(errors="replace").partition("=")
        if k.startswith("PGWAL_SHIM_") or k == "LD_PRELOAD":
            env[k] = v
    return {"mapped": mapped, "env": env}


_probe_cache: dict[str, dict] = {}


def probe_disk(node) -> dict:
    """fdatasync/pwrite times of a probe run as the server user with the
    node's shim environment, on its file system (cached per profile)."""
    prof = node.disk_profile
    if prof.name in _probe_cache:
        return _probe_cache[prof.name]
    d = node.root / "mnt" / "shim-probe"
    # the file's path must contain the profile's match string, as pg_wal's do
    if prof.match:
        d = d / prof.match.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    for p in [d, *d.parents]:
        if p == node.root / "mnt":
            break
        chown_to_pg(p)
    out = run([shim.build_probe(), d / "probe.dat", PROBE_ROUNDS, PROBE_BYTES], as_pg=True, env=node.env(),
              timeout=60).stdout
    res = json.loads(out)
    _probe_cache[prof.name] = res
    return res


def prove_disk(node) -> dict:
    prof = node.disk_profile
    want = node.env()
    pid = node.pid()
    if pid is None:
        raise ProofError(f"{node.name}: not running")
    st = shim_state(pid)
    if not want:
        if st["mapped"]:
            raise ProofError(f"{node.name}: disk profile {prof.name!r} adds no latency, but its postmaster "
                             f"(pid {pid}) has the shim loaded")
        return {"profile": prof.name, "shim": False}
    if want["LD_PRELOAD"] not in st["mapped"]:
        raise ProofError(
            f"{node.name}: disk profile {prof.name!r} needs the fsync shim, but the postmaster (pid {pid}) "
            f"has not loaded {want['LD_PRELOAD']} (the dynamic loader skips a preload it cannot open: can "
            f"the server user read it and every directory above it?)")
    for k, v in want.items():
        if st["env"].get(k) != v:
            raise ProofError(f"{node.name}: the postmaster runs with {k}={st['env'].get(k)!r}, "
                             f"the profile {prof.name!r} wants {v!r}")
    probe = probe_disk(node)
    need_fsync = prof.fsync_us
    need_pwrite = prof.pwrite_us + PROBE_BYTES * prof.pwrite_us_per_mb / 1048576
    if probe["fdatasync_us_min"] + SLACK_US < need_fsync:
        raise ProofError(f"{node.name}: disk profile {prof.name!r} adds {need_fsync:g} us per fdatasync, "
                         f"but a probe as the server user took {probe['fdatasync_us_min']:.0f} us")
    if probe["pwrite_us_min"] + SLACK_US < need_pwrite:
        raise ProofError(f"{node.name}: disk profile {prof.name!r} adds {need_pwrite:.0f} us per "
                         f"{PROBE_BYTES}-byte pwrite, but a probe as the server user took "
                         f"{probe['pwrite_us_min']:.0f} us")
    return {"profile": prof.name, "shim": True, "probe": probe}


_TIME = re.compile(r"^Time: ([0-9.]+) ms", re.M)


def link_rtts_ms(standby) -> list[float]:
    """Round trips of `SELECT 1` through the standby's proxy, from the
    standby's side of the link (its namespace), in ms."""
    script = "\\timing on\n" + "SELECT 1;\n" * RTT_ROUNDS
    p = run([standby.bin("psql"), "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", standby.proxy.port,
             "-U", "postgres", "-d", "postgres"], netns=standby.netns, input=script, timeout=60)
    return [float(x) for x in _TIME.findall(p.stdout)]


def prove_link(standby) -> dict:
    prof = standby.net_profile
    if prof.proxy:
        if not standby.proxy or standby.proxy.proc is None or standby.proxy.proc.poll() is not None:
            raise ProofError(f"{standby.name}: link profile {prof.name!r} needs a delay proxy, none is running")
        want = ("127.0.0.1", standby.proxy.port)
    else:
        want = (standby.upstream.addr_for(standby), standby.upstream.port)
    row = wait_for(lambda: (standby.sql("SELECT sender_host, sender_port FROM pg_stat_wal_receiver "
                                        "WHERE status = 'streaming'") or [None])[0], 30,
                   f"{standby.name}'s walreceiver to stream")
    if (row[0], int(row[1])) != (want[0], int(want[1])):
        raise ProofError(f"{standby.name}: the walreceiver streams from {row[0]}:{row[1]}, not "
                         f"{want[0]}:{want[1]} as link profile {prof.name!r} says")
    if not prof.proxy:
        return {"profile": prof.name, "proxy": False}
    rtts = link_rtts_ms(standby)
    if len(rtts) < RTT_ROUNDS // 2:
        raise ProofError(f"{standby.name}: the round-trip probe through the proxy did not answer")
    need = prof.up_ms + prof.down_ms
    low = min(rtts)
    if low + SLACK_US / 1000 < need:
        raise ProofError(f"{standby.name}: link profile {prof.name!r} delays a round trip by {need:g} ms, "
                         f"but one through the proxy took {low:.3f} ms")
    return {"profile": prof.name, "proxy": True, "rtt_ms_min": low, "rtt_ms_median": sorted(rtts)[len(rtts) // 2],
            "configured_rtt_ms": need}


def prove_build(cluster) -> dict:
    bin_dir = Path(cluster.spec.bin_dir).resolve()
    want = (bin_dir / "postgres").resolve()
    for n in cluster.nodes.values():
        if not n.running:
            continue
        try:
            exe = Path(os.readlink(f"/proc/{n.pid()}/exe"))
        except (OSError, TypeError) as e:
            raise ProofError(f"{n.name}: cannot tell which postgres runs: {e}") from None
        if exe != want:
            raise ProofError(f"{n.name}: the postmaster executes {exe}, not {want}")
    info = read_build_info(bin_dir)
    levels = server_levels(cluster.primary)
    patched = "remote_receive" in levels
    if info and not patched:
        raise ProofError(f"{bin_dir} is labelled as pgwal's patched build (PGWAL-BUILD), but the running "
                         f"server does not know synchronous_commit = remote_receive")
    return {"postgres": str(want), "server_version": cluster.server_version(), "patched": patched,
            "build": info or None}


STANDBY_SETTINGS = ("wal_receiver_reply_events", "wal_receiver_flush_worker", "wal_receiver_accept_unflushed",
                    "wal_receiver_early_receipt_min_write", "wal_receiver_flush_worker_min_fsync")


def standby_settings(node) -> dict:
    """The standby settings that change what a commit waits for, as the
    standby has them (those its build knows)."""
    return dict(node.sql("SELECT name, setting FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
                         (list(STANDBY_SETTINGS),)))


def prove(cluster) -> dict:
    """Check every label of a lab-made cluster; returns what was checked."""
    out = {"build": prove_build(cluster), "nodes": {}}
    for n in cluster.nodes.values():
        if not n.running:
            continue
        entry = {"disk": prove_disk(n), "postmaster_pid": n.pid()}
        if n.upstream is not None:
            entry["link"] = prove_link(n)
            entry["settings"] = standby_settings(n)
        out["nodes"][n.name] = entry
    return out


def summary(p: dict) -> str:
    """One line: what was shown to be in effect."""
    parts = [("patched " if p["build"]["patched"] else "stock ") + str(p["build"]["server_version"])]
    if p.get("external"):
        parts.append("existing cluster " + ", ".join(f"{n} {r['sync_state']}" for n, r in p["replication"].items())
                     + ", no emulated disks or links")
    for name, e in p.get("nodes", {}).items():
        d = e["disk"]
        s = f"{name}: disk {d['profile']}"
        if d.get("probe"):
            s += f" (fdatasync {d['probe']['fdatasync_us_median']:.0f} us)"
        if "link" in e:
            lk = e["link"]
            s += f", link {lk['profile']}" + (f" (rtt {lk['rtt_ms_median']:.2f} ms)" if lk.get("proxy") else "")
        parts.append(s)
    return "; ".join(parts)
