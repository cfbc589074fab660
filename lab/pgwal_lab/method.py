"""The benchmark method.

Variants that are compared with each other form a *group*.  Within a group
runs are interleaved (A B C A B C ...), so slow drifts of the machine hit
every variant alike.  Before every measured run:
  1. the variant's settings are applied (ALTER SYSTEM + reload, verified),
  2. every standby has replayed the primary's current LSN,
  3. CHECKPOINT on every node, `sync`, then a settle pause,
  4. an unmeasured warm-up run.
During the run pg_stat_replication is sampled; after it the run's metrics
are collected: TPS, latency mean/p50/p99 (pgbench per-transaction log), WAL
bytes (LSN difference), replication lags, walsender/walreceiver CPU (from
/proc), WAL read by walsenders (pg_stat_io, PostgreSQL 18+), and the time
standbys need to replay everything.  Each run is stored with its config.
A group's environment (disk profiles, network profile) is applied once
before its first run.
"""
from __future__ import annotations

import os
from pathlib import Path
import threading
import time
from dataclasses import dataclass, field

from .util import LabError, proc_cpu_seconds
from .workloads import Workload, run_pgbench


@dataclass
class MethodConf:
    iterations: int = 10
    duration: float = 30.0
    warmup: float = 5.0
    settle: float = 10.0
    checkpoint: bool = True
    sync: bool = True
    replay_timeout: float = 300.0
    reset_data: bool = False

    def asdict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Variant:
    name: str
    group: str
    workload: Workload
    clients: int = 4
    settings: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # primary_disk, standby_disk, net
    meta: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"name": self.name, "group": self.group, "clients": self.clients, "settings": self.settings,
                "env": self.env, "workload": self.workload.describe(), "meta": self.meta}


def apply_env(cluster, env: dict) -> None:
    if "primary_disk" in env and cluster.primary.disk_profile.name != env["primary_disk"]:
        cluster.primary.set_disk(env["primary_disk"])
    for s in cluster.standbys:
        if "standby_disk" in env and s.disk_profile.name != env["standby_disk"]:
            s.set_disk(env["standby_disk"])
        if "net" in env and s.net_profile.name != env["net"]:
            s.set_net(env["net"])
    cluster.wait_streaming()


def apply_settings(cluster, settings: dict, timeout: float = 10) -> None:
    if not settings:
        return
    with cluster.primary.connect() as c:
        for k, v in settings.items():
            c.execute(f"ALTER SYSTEM SET {k} = '{v}'")
        c.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + timeout
    for k, v in settings.items():
        while True:
            cur = cluster.primary.scalar(f"SHOW {k}")
            if str(cur) == str(v):
                break
            if time.monotonic() > deadline:
                raise LabError(f"setting {k}={v} not applied (still {cur})")
            time.sleep(0.05)


def quiesce(cluster, conf: MethodConf) -> float:
    """Replay catch-up, checkpoint everywhere, sync, settle.  Returns catch-up seconds."""
    catchup = cluster.wait_replay(timeout=conf.replay_timeout)
    if conf.checkpoint:
        cluster.primary.sql("CHECKPOINT")
        for s in cluster.standbys:
            if s.running:
                s.sql("CHECKPOINT")
    if conf.sync:
        os.sync()
    if conf.settle > 0:
        time.sleep(conf.settle)
    return catchup


class ReplSampler(threading.Thread):
    """Samples pg_stat_replication on the primary every `interval` seconds."""

    def __init__(self, cluster, interval: float = 0.5):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.interval = interval
        self.samples: list[dict] = []
        self.stop_ev = threading.Event()

    def run(self) -> None:
        try:
            conn = self.cluster.primary.connect()
        except Exception:
            return
        with conn:
            while not self.stop_ev.is_set():
                try:
                    rows = conn.execute(
                        "SELECT application_name, extract(epoch FROM write_lag), extract(epoch FROM flush_lag), "
                        "extract(epoch FROM replay_lag), pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) "
                        "FROM pg_stat_replication").fetchall()
                    for r in rows:
                        self.samples.append({"name": r[0], "write": r[1], "flush": r[2], "replay": r[3],
                                             "replay_bytes": r[4]})
                except Exception:
                    break
                self.stop_ev.wait(self.interval)

    def stop(self) -> dict:
        self.stop_ev.set()
        self.join(5)
        out = {}
        for k in ("write", "flush", "replay"):
            vals = [float(s[k]) * 1000 for s in self.samples if s[k] is not None]
            out[f"{k}_lag_ms_mean"] = sum(vals) / len(vals) if vals else None
            out[f"{k}_lag_ms_max"] = max(vals) if vals else None
        rb = [float(s["replay_bytes"]) for s in self.samples if s["replay_bytes"] is not None]
        out["replay_lag_bytes_max"] = max(rb) if rb else None
        return out


def _walsender_pids(cluster) -> list[int]:
    pids = []
    for n in cluster.nodes.values():
        if n.running:
            try:
                pids += [r[0] for r in n.sql("SELECT pid FROM pg_stat_replication")]
            except Exception:
                pass
    return pids


def _walreceiver_pids(cluster) -> list[int]:
    pids = []
    for s in cluster.standbys:
        if s.running:
            p = s.scalar("SELECT pid FROM pg_stat_wal_receiver")
            if p:
                pids.append(p)
    return pids


def _cpu(pids) -> dict:
    return {p: proc_cpu_seconds(p) for p in pids}


def _io(pids) -> dict:
    """/proc/<pid>/io read_bytes (storage reads) and rchar (all read() bytes) per pid."""
    out = {}
    for p in pids:
        try:
            kv = dict(l.split(": ") for l in Path(f"/proc/{p}/io").read_text().splitlines())
            out[p] = (int(kv["read_bytes"]), int(kv["rchar"]))
        except (OSError, KeyError, ValueError):
            out[p] = None
    return out


def _io_delta(before: dict, after: dict, idx: int) -> float | None:
    if not before or sorted(before) != sorted(after) or any(before[p] is None or after[p] is None for p in before):
        return None
    return float(sum(after[p][idx] - before[p][idx] for p in before))


def _cpu_delta(before: dict, after_pids: list[int], after: dict) -> float | None:
    """CPU seconds used by the same processes; None when one exited or was
    replaced during the run (a reconnect would make the delta meaningless)."""
    if not before or sorted(before) != sorted(after_pids):
        return None
    if any(before[p] is None or after.get(p) is None for p in before):
        return None
    return sum(after[p] - before[p] for p in before)


def _proxy_counters(cluster) -> dict:
    out = {}
    for s in cluster.standbys:
        if s.proxy:
            c = s.proxy.counters()
            if c:
                out[s.name] = c
    return out


def walsender_wal_reads(cluster) -> tuple[float | None, float | None]:
    """(reads, read bytes) of WAL by walsenders from pg_stat_io; None before PG 18."""
    try:
        cols = {r[0] for r in cluster.primary.sql(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_stat_io'::regclass AND attnum > 0")}
        if "read_bytes" not in cols:
            return None, None
        r = cluster.primary.sql("SELECT coalesce(sum(reads), 0), coalesce(sum(read_bytes), 0) FROM pg_stat_io "
                                "WHERE backend_type = 'walsender' AND object = 'wal'")[0]
        return float(r[0]), float(r[1])
    except Exception:
        return None, None


def measure(cluster, variant: Variant, conf: MethodConf) -> dict:
    """One measured run (after quiesce and warm-up)."""
    pg_bin = cluster.spec.bin_dir
    p = cluster.primary
    if conf.warmup > 0:
        run_pgbench(p, pg_bin, variant.workload, variant.clients, duration=conf.warmup, log=False)
    ws, wr = _walsender_pids(cluster), _walreceiver_pids(cluster)
    cpu_ws0, cpu_wr0 = _cpu(ws), _cpu(wr)
    pio0 = _io(ws)
    io0 = walsender_wal_reads(cluster)
    lsn0 = cluster.current_lsn()
    time.sleep(0.25)  # proxy counters are refreshed every 200 ms
    px0 = _proxy_counters(cluster)
    sampler = ReplSampler(cluster) if cluster.standbys else None
    if sampler:
        sampler.start()
    t0 = time.monotonic()
    try:
        res = run_pgbench(p, pg_bin, variant.workload, variant.clients, duration=conf.duration)
    finally:
        lags = sampler.stop() if sampler else {}
    elapsed = time.monotonic() - t0
    lsn1 = cluster.current_lsn()
    time.sleep(0.25)
    px1 = _proxy_counters(cluster)
    up = [px1[k]["up_chunks"] - px0[k]["up_chunks"] for k in px1 if k in px0]
    down = [px1[k]["down_chunks"] - px0[k]["down_chunks"] for k in px1 if k in px0]
    cpu_ws1, cpu_wr1 = _cpu(ws), _cpu(wr)
    pio1 = _io(ws)
    ws1, wr1 = _walsender_pids(cluster), _walreceiver_pids(cluster)
    d_ws = _cpu_delta(cpu_ws0, ws1, cpu_ws1)
    d_wr = _cpu_delta(cpu_wr0, wr1, cpu_wr1)
    io1 = walsender_wal_reads(cluster)
    wal = float(p.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (lsn1, lsn0)))
    t1 = time.monotonic()
    cluster.wait_replay(timeout=conf.replay_timeout, lsn=lsn1)
    res.update(lags)
    res.update({
        "elapsed_s": elapsed,
        "wal_bytes": wal,
        "wal_bytes_per_txn": wal / res["transactions"] if res.get("transactions") else None,
        "walsender_cpu_s": d_ws,
        "walreceiver_cpu_s": d_wr,
        "walsender_cpu_pct": d_ws / elapsed * 100 if d_ws is not None else None,
        "walreceiver_cpu_pct": d_wr / elapsed * 100 if d_wr is not None else None,
        # replication processes replaced during the run (reconnects): should be 0
        "repl_process_changes": len(set(ws) ^ set(ws1)) + len(set(wr) ^ set(wr1)),
        "walsender_wal_reads": (io1[0] - io0[0]) if io0[0] is not None and io1[0] is not None else None,
        "walsender_wal_read_bytes": (io1[1] - io0[1]) if io0[1] is not None and io1[1] is not None else None,
        # from /proc, any server version: bytes walsenders read from storage / via read()
        "walsender_storage_read_bytes": _io_delta(pio0, pio1, 0),
        "walsender_rchar_bytes": _io_delta(pio0, pio1, 1),
        "replay_catchup_after_s": time.monotonic() - t1,
        # chunks the proxy carried standby -> primary: status replies (≈ packets)
        "reply_chunks_per_s": sum(up) / (elapsed + 0.5) if up else None,
        "reply_chunks_per_txn": sum(up) / res["transactions"] if up and res.get("transactions") else None,
        "wal_chunks_per_s": sum(down) / (elapsed + 0.5) if down else None,
    })
    return res


def run_groups(cluster, variants: list[Variant], conf: MethodConf, store, scenario: str, run_id: str,
               common: dict, progress=None, deadline: float | None = None) -> list[dict]:
    """Run every group's variants interleaved, `conf.iterations` times."""
    groups: dict[str, list[Variant]] = {}
    for v in variants:
        groups.setdefault(v.group, []).append(v)
    records = []
    for gname, vs in groups.items():
        apply_env(cluster, vs[0].env)
        for it in range(conf.iterations):
            for v in vs:
                if deadline and time.monotonic() > deadline:
                    raise LabError(f"scenario time limit reached in {gname} iteration {it}")
                apply_env(cluster, v.env)  # no-op unless this variant's environment differs
                apply_settings(cluster, v.settings)
                if conf.reset_data:
                    v.workload.reset(cluster.primary)
                catchup = quiesce(cluster, conf)
                started = time.time()
                metrics = measure(cluster, v, conf)
                metrics["replay_catchup_before_s"] = catchup
                rec = {"scenario": scenario, "run_id": run_id, "group": gname, "variant": v.name,
                       "iteration": it, "started_at": started, "variant_config": v.describe(),
                       "method": conf.asdict(), "metrics": metrics, **common}
                store.append(rec)
                records.append(rec)
                if progress:
                    progress(f"{gname} / {v.name} #{it + 1}: {metrics.get('tps') or 0:.0f} tps")
    return records


def estimate_seconds(n_runs: int, conf: MethodConf, overhead: float = 3.0) -> float:
    return n_runs * (conf.duration + conf.warmup + conf.settle + overhead)
