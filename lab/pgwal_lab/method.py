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
standbys need to replay everything.  On the primary also: pg_stat_wal
(records, FPI, bytes, wal_buffers_full) and pg_stat_io WAL writes/fsyncs
per backend type (PostgreSQL 18+) as deltas over the run, and the wait
events of client backends sampled from pg_stat_activity (share of samples
per wait event).  A variant may add concurrent reader clients (a second
pgbench with its own script and session settings).  Each run is stored
with its config.
A group's environment (disk profiles, network profile) is applied once
before its first run.  A variant's environment may name a build (a bin
dir): the nodes are then restarted on it, so variants of a stock and a
patched build interleave in one group.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
import threading
import time
from dataclasses import dataclass, field

from .replay_delay import ReplayDelaySampler
from .util import LabError, cpu_share_pct, host_cpu_times, proc_cpu_seconds, proc_schedstat, run_queue_wait_us
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
    # restart every node before each run (and prove the environment again):
    # no run inherits state from the one before it, e.g. a walsender that a
    # remote_receive commit asked for early receipts
    restart: bool = False
    # VACUUM the workload's tables before each run: the lab switches
    # variants with a configuration reload, and every reload makes the
    # autovacuum launcher reschedule its databases a full naptime ahead, so
    # with runs closer together than autovacuum_naptime it never starts a
    # worker and tables only grow (measured: a one-row table at 34 MB)
    vacuum: bool = True
    wait_sample_s: float = 0.2  # pg_stat_activity sampling interval (0: off)
    # primary flush -> standby replay delay sampling interval (0: off; replay_delay.py)
    replay_probe_s: float = 0.0

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
    # optional concurrent readers: a second pgbench with `readers` clients
    # running `reader_workload`, its sessions started with `reader_settings`
    readers: int = 0
    reader_workload: Workload | None = None
    reader_settings: dict = field(default_factory=dict)

    def describe(self) -> dict:
        d = {"name": self.name, "group": self.group, "clients": self.clients, "settings": self.settings,
             "env": self.env, "workload": self.workload.describe(), "meta": self.meta}
        if self.readers:
            d.update(readers=self.readers, reader_settings=self.reader_settings,
                     reader_workload=self.reader_workload.describe() if self.reader_workload else None)
        return d


def apply_env(cluster, env: dict) -> bool:
    """Put the group's environment in place; True when a node, link or
    standby setting changed (and the proof must be taken again)."""
    changed = False
    if "build" in env and Path(env["build"]).resolve() != Path(cluster.spec.bin_dir).resolve():
        cluster.switch_build(Path(env["build"]))
        changed = True
    if "primary_disk" in env and cluster.primary.disk_profile.name != env["primary_disk"]:
        cluster.primary.set_disk(env["primary_disk"])
        changed = True
    for s in cluster.standbys:
        if "standby_disk" in env and s.disk_profile.name != env["standby_disk"]:
            s.set_disk(env["standby_disk"])
            changed = True
        if "net" in env and s.net_profile.name != env["net"]:
            s.set_net(env["net"])
            changed = True
        # standby_settings: reloadable settings of every standby (ALTER SYSTEM)
        changed |= set_reloadable(s, env.get("standby_settings") or {})
    cluster.wait_streaming()
    return changed


def set_reloadable(node, settings: dict, timeout: float = 10) -> bool:
    """ALTER SYSTEM + reload on one node, then wait until SHOW reports every
    new value (a reload reaches backends asynchronously).  False when every
    setting already had its value."""
    settings = {k: v for k, v in settings.items() if str(node.scalar(f"SHOW {k}")) != str(v)}
    if not settings:
        return False
    node.alter_system(settings)
    deadline = time.monotonic() + timeout
    for k, v in settings.items():
        while True:
            cur = node.scalar(f"SHOW {k}")
            if str(cur) == str(v):
                break
            if time.monotonic() > deadline:
                raise LabError(f"setting {k}={v} not applied on {node.name} (still {cur})")
            time.sleep(0.05)
    return True


def apply_settings(cluster, settings: dict, timeout: float = 10) -> None:
    set_reloadable(cluster.primary, settings, timeout)
    if "stream_unflushed_wal" in settings:
        check_send_mode(cluster, "written" if settings["stream_unflushed_wal"] == "written" else "flushed",
                        timeout)


def check_send_mode(cluster, want: str, timeout: float = 10) -> None:
    """Prove that the primary's walsenders send WAL as the variant says
    (pg_stat_replication.send_mode, patch 0008); a walsender picks up a
    reload when it next wakes, so WAL is written meanwhile."""
    deadline = time.monotonic() + timeout
    if not cluster.primary.scalar("SELECT count(*) FROM pg_attribute WHERE attrelid = "
                                  "'pg_stat_replication'::regclass AND attname = 'send_mode'"):
        return check_send_mode_by_marker(cluster, want, deadline)
    while True:
        modes = [r[0] for r in cluster.primary.sql("SELECT send_mode FROM pg_stat_replication")]
        if modes and all(m == want for m in modes):
            return
        if time.monotonic() > deadline:
            raise LabError(f"walsenders send {modes or 'nothing'}, not {want} WAL")
        cluster.primary.sql("SELECT pg_logical_emit_message(false, 'pgwal-lab', 'wake')")
        time.sleep(0.1)


UNFLUSHED_MARKER = "global/pg_unflushed_sent"


def check_send_mode_by_marker(cluster, want: str, deadline: float) -> None:
    """The same proof on a data directory made by stock initdb, whose
    pg_stat_replication has no send_mode (a baseline run): a primary
    writes the crash marker durably before its first unflushed byte leaves
    and removes it at a clean shutdown, so after a restart the marker
    exists exactly when a walsender has sent unflushed WAL."""
    datadir = getattr(cluster.primary, "datadir", None)
    if datadir is None:
        raise LabError("cannot prove the send mode: no send_mode column and no data directory to look at")
    marker = Path(datadir) / UNFLUSHED_MARKER
    if want == "flushed":
        if marker.exists():
            raise LabError(f"cannot prove flushed sending: {marker} is left from unflushed sending "
                           "(restart the nodes before the run: --set restart=true)")
        return
    while not marker.exists():
        if time.monotonic() > deadline:
            raise LabError(f"walsenders send flushed WAL, not written: no {marker}")
        cluster.primary.sql("SELECT pg_logical_emit_message(false, 'pgwal-lab', 'wake')")
        time.sleep(0.1)


def quiesce(cluster, conf: MethodConf) -> float:
    """Replay catch-up, checkpoint everywhere, sync, settle.  Returns catch-up seconds."""
    catchup = cluster.wait_replay(timeout=conf.replay_timeout)
    if conf.checkpoint:
        cluster.primary.sql("CHECKPOINT")
        for s in cluster.standbys:
            if s.running:
                s.sql("CHECKPOINT")
    if conf.sync and cluster.local_processes:
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


WRITER_APP = "pgwal-writer"
READER_APP = "pgwal-reader"


class WaitSampler(threading.Thread):
    """Samples the wait events of client backends (pg_stat_activity) on one
    node every `interval` seconds.  Each sampled backend counts once per
    sample under `application:state:wait_event_type:wait_event`, where an
    active backend without a wait event is `CPU` and an idle one waiting
    for its client is `idle` (pgbench's next statement not there yet)."""

    QUERY = ("SELECT coalesce(application_name, ''), state, wait_event_type, wait_event, count(*) "
             "FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
             "GROUP BY 1, 2, 3, 4")

    def __init__(self, node, interval: float = 0.2):
        super().__init__(daemon=True)
        self.node = node
        self.interval = interval
        self.counts: dict[str, int] = {}
        self.samples = 0
        self.stop_ev = threading.Event()

    @staticmethod
    def key(app, state, wtype, wevent) -> str:
        role = "reader" if app == READER_APP else ("writer" if app == WRITER_APP else "other")
        if state in ("idle", "idle in transaction") and wevent == "ClientRead":
            what = "idle" if state == "idle" else "idle in transaction"
        elif wtype is None:
            what = "CPU"
        else:
            what = f"{wtype}:{wevent}"
        return f"{role}:{what}"

    def run(self) -> None:
        try:
            conn = self.node.connect()
        except Exception:
            return
        with conn:
            while not self.stop_ev.is_set():
                try:
                    rows = conn.execute(self.QUERY).fetchall()
                except Exception:
                    break
                self.samples += 1
                for app, state, wt, we, n in rows:
                    k = self.key(app, state, wt, we)
                    self.counts[k] = self.counts.get(k, 0) + int(n)
                self.stop_ev.wait(self.interval)

    def stop(self) -> dict:
        self.stop_ev.set()
        self.join(5)
        return summarize_waits(self.counts, self.samples)


def summarize_waits(counts: dict, samples: int) -> dict:
    """Shares of backend-samples per wait key, per role (writer/reader/other)."""
    out: dict = {"wait_samples": samples}
    by_role: dict[str, dict[str, int]] = {}
    for k, n in counts.items():
        role, what = k.split(":", 1)
        by_role.setdefault(role, {})[what] = n
    for role, d in by_role.items():
        tot = sum(d.values())
        out[f"{role}_waits"] = {w: n / tot for w, n in sorted(d.items(), key=lambda kv: -kv[1])} if tot else {}
        out[f"{role}_backends_mean"] = tot / samples if samples else None
    return out


def wal_counters(node) -> dict:
    """Cumulative WAL counters of a node: pg_stat_wal (PostgreSQL 14+; up to
    17 also wal_write/wal_sync) and, PostgreSQL 18+, pg_stat_io rows of object
    'wal' per backend type (writes, fsyncs, write bytes).  {} if unavailable."""
    out: dict = {}
    try:
        row = node.scalar("SELECT to_jsonb(w) FROM pg_stat_wal w")
        for k in ("wal_records", "wal_fpi", "wal_bytes", "wal_buffers_full", "wal_write", "wal_sync"):
            if row and row.get(k) is not None:
                out[k] = float(row[k])
    except Exception:
        pass
    try:
        has = node.scalar("SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('pg_stat_io') "
                          "AND attname = 'write_bytes'")
        if has:
            io = {}
            for bt, w, f, wb in node.sql("SELECT backend_type, coalesce(sum(writes), 0), coalesce(sum(fsyncs), 0), "
                                         "coalesce(sum(write_bytes), 0) FROM pg_stat_io WHERE object = 'wal' "
                                         "GROUP BY 1"):
                io[bt] = {"writes": float(w), "fsyncs": float(f), "write_bytes": float(wb)}
            out["io"] = io
    except Exception:
        pass
    return out


def wal_counter_deltas(before: dict, after: dict, transactions: int | None) -> dict:
    """Run deltas of wal_counters() and per-transaction figures."""
    out: dict = {}
    per = (lambda v: v / transactions if transactions and v is not None else None)
    for k in ("wal_records", "wal_fpi", "wal_buffers_full", "wal_write", "wal_sync"):
        if k in before and k in after:
            out[f"stat_{k}"] = after[k] - before[k]
    if "wal_bytes" in before and "wal_bytes" in after:
        out["stat_wal_bytes"] = after["wal_bytes"] - before["wal_bytes"]
    if "io" in before and "io" in after:
        by = {}
        for bt in set(before["io"]) | set(after["io"]):
            a, b = after["io"].get(bt, {}), before["io"].get(bt, {})
            d = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in ("writes", "fsyncs", "write_bytes")}
            if any(d.values()):
                by[bt] = d
        out["wal_io_by_backend"] = by
        out["wal_io_writes"] = sum(d["writes"] for d in by.values())
        out["wal_io_fsyncs"] = sum(d["fsyncs"] for d in by.values())
    elif "stat_wal_write" in out:  # before PostgreSQL 18
        out["wal_io_writes"] = out["stat_wal_write"]
        out["wal_io_fsyncs"] = out.get("stat_wal_sync")
    out["wal_records_per_txn"] = per(out.get("stat_wal_records"))
    out["wal_fpi_per_txn"] = per(out.get("stat_wal_fpi"))
    out["wal_writes_per_txn"] = per(out.get("wal_io_writes"))
    out["wal_fsyncs_per_txn"] = per(out.get("wal_io_fsyncs"))
    out["txn_per_wal_fsync"] = (transactions / out["wal_io_fsyncs"]
                                if transactions and out.get("wal_io_fsyncs") else None)
    return out


def _run_readers(p, pg_bin, variant: Variant, duration: float, log: bool, box: dict) -> None:
    """Run the variant's reader pgbench (in a thread); result or error into box."""
    try:
        env = {"PGAPPNAME": READER_APP}
        if variant.reader_settings:
            env["PGOPTIONS"] = " ".join(f"-c {k}={v}" for k, v in variant.reader_settings.items())
        box["res"] = run_pgbench(p, pg_bin, variant.reader_workload, variant.readers, duration=duration, log=log,
                                 env=env, threads=1)
    except Exception as e:  # re-raised by the caller
        box["err"] = e


def run_with_readers(p, pg_bin, variant: Variant, duration: float, log: bool = True) -> dict:
    """The variant's writer pgbench, with its reader pgbench alongside when it has readers."""
    if not variant.readers:
        return run_pgbench(p, pg_bin, variant.workload, variant.clients, duration=duration, log=log,
                           env={"PGAPPNAME": WRITER_APP})
    box: dict = {}
    t = threading.Thread(target=_run_readers, args=(p, pg_bin, variant, duration, log, box), daemon=True)
    t.start()
    try:
        res = run_pgbench(p, pg_bin, variant.workload, variant.clients, duration=duration, log=log,
                          env={"PGAPPNAME": WRITER_APP})
    finally:
        t.join(duration + 150)
    if "err" in box:
        raise box["err"]
    r = box.get("res")
    if r is None:
        raise LabError("reader pgbench did not finish")
    res.update({"read_tps": r["tps"], "read_transactions": r["transactions"], "read_failed": r["failed"],
                "read_clients": variant.readers})
    if log:
        res.update({"read_lat_mean_ms": r["lat_mean_ms"], "read_lat_p50_ms": r["lat_p50_ms"],
                    "read_lat_p99_ms": r["lat_p99_ms"]})
    return res


def _walsender_pids(cluster) -> list[int]:
    if not cluster.local_processes:  # another machine's pids: /proc here knows nothing of them
        return []
    pids = []
    for n in cluster.nodes.values():
        if n.running:
            try:
                pids += [r[0] for r in n.sql("SELECT pid FROM pg_stat_replication")]
            except Exception:
                pass
    return pids


def _standby_pids(cluster, query: str) -> list[int]:
    """The pid `query` finds on each running standby (none from another machine)."""
    if not cluster.local_processes:
        return []
    pids = []
    for s in cluster.standbys:
        if s.running:
            p = s.scalar(query)
            if p:
                pids.append(p)
    return pids


def _walreceiver_pids(cluster) -> list[int]:
    return _standby_pids(cluster, "SELECT pid FROM pg_stat_wal_receiver")


def _startup_pids(cluster) -> list[int]:
    """The standbys' startup processes: they replay."""
    return _standby_pids(cluster, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup'")


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


def _proxy_cpu(cluster) -> dict:
    """CPU seconds used so far by each standby's delay proxy (all its threads)."""
    out = {}
    for s in cluster.standbys:
        if s.proxy and s.proxy.pid:
            c = proc_cpu_seconds(s.proxy.pid)
            if c is not None:
                out[s.proxy.pid] = c
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
        run_with_readers(p, pg_bin, variant, conf.warmup, log=False)
    tables0 = variant.workload.table_stats(p)
    ws, wr = _walsender_pids(cluster), _walreceiver_pids(cluster)
    cpu_ws0, cpu_wr0 = _cpu(ws), _cpu(wr)
    st = _startup_pids(cluster)
    cpu_st0 = _cpu(st)
    # how long the standby's replay processes wait for a core once woken
    sched0 = {p: proc_schedstat(p) for p in st + wr}
    pio0 = _io(ws)
    io0 = walsender_wal_reads(cluster)
    lsn0 = cluster.current_lsn()
    time.sleep(0.25)  # proxy counters are refreshed every 200 ms
    px0 = _proxy_counters(cluster)
    pxcpu0 = _proxy_cpu(cluster)
    wal0 = wal_counters(p)
    # which standby process fsyncs its WAL (walreceiver, or its flush worker)
    swal0 = wal_counters(cluster.standbys[0]) if cluster.standbys else {}
    sampler = ReplSampler(cluster) if cluster.standbys else None
    if sampler:
        sampler.start()
    waits = WaitSampler(p, conf.wait_sample_s) if conf.wait_sample_s else None
    if waits:
        waits.start()
    replay_probe = (ReplayDelaySampler(p, cluster.standbys[0], conf.replay_probe_s)
                    if conf.replay_probe_s and cluster.standbys else None)
    if replay_probe:
        replay_probe.start()
    load0 = os.getloadavg()[0]
    hc0 = host_cpu_times()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        res = run_with_readers(p, pg_bin, variant, conf.duration)
    finally:
        lags = sampler.stop() if sampler else {}
        wait_summary = waits.stop() if waits else {}
        if replay_probe:
            lags.update(replay_probe.stop())
    elapsed = time.monotonic() - t0
    pxcpu1 = _proxy_cpu(cluster)
    hc1 = host_cpu_times()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    lsn1 = cluster.current_lsn()
    # exited backends have reported their statistics; give the WAL writer a
    # moment to report its own (it does so on its next cycle)
    time.sleep(0.5)
    wal1 = wal_counters(p)
    # (the flush worker reports its counters at most once a second; read at
    # the same lag at both ends, the delta covers a window as long as the run)
    swal1 = wal_counters(cluster.standbys[0]) if cluster.standbys else {}
    px1 = _proxy_counters(cluster)
    up = [px1[k]["up_chunks"] - px0[k]["up_chunks"] for k in px1 if k in px0]
    down = [px1[k]["down_chunks"] - px0[k]["down_chunks"] for k in px1 if k in px0]
    cpu_ws1, cpu_wr1 = _cpu(ws), _cpu(wr)
    sched1 = {p: proc_schedstat(p) for p in sched0}
    pio1 = _io(ws)
    ws1, wr1 = _walsender_pids(cluster), _walreceiver_pids(cluster)
    d_ws = _cpu_delta(cpu_ws0, ws1, cpu_ws1)
    d_wr = _cpu_delta(cpu_wr0, wr1, cpu_wr1)
    io1 = walsender_wal_reads(cluster)
    wal = float(p.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (lsn1, lsn0)))
    tables1 = variant.workload.table_stats(p)
    if tables0 and tables1:
        # dead-row counts come from the statistics system: approximate, and
        # behind by up to one stats flush
        res.update({"table_bytes_before": tables0["bytes"], "table_bytes_after": tables1["bytes"],
                    "table_dead_rows_before": tables0["dead_rows"],
                    "table_dead_rows_after": tables1["dead_rows"]})
    t1 = time.monotonic()
    cluster.wait_replay(timeout=conf.replay_timeout, lsn=lsn1)
    # after the wait: the startup process's CPU then covers the replay of
    # the run's WAL (and of what the warm-up left unreplayed, a few ms' worth)
    d_st = _cpu_delta(cpu_st0, _startup_pids(cluster), _cpu(st))
    res["startup_cpu_s"] = d_st
    res["replay_mb_per_cpu_s"] = wal / d_st / 1e6 if d_st else None
    # one standby here: the first startup process and walreceiver
    res["startup_runq_wait_us"] = run_queue_wait_us(sched0.get(st[0]), sched1.get(st[0])) if st else None
    res["walreceiver_runq_wait_us"] = run_queue_wait_us(sched0.get(wr[0]), sched1.get(wr[0])) if wr else None
    res.update(lags)
    res.update(wait_summary)
    # the emulated links as they were (a named profile's values may change
    # between lab versions, e.g. lan's polling window)
    res["links"] = {s.name: s.net_profile.asdict() for s in cluster.standbys if s.net_profile.proxy}
    # whole machine (servers, pgbench, and whatever else runs here)
    res["loadavg_1m_before"] = load0
    # pgbench processes of this run (children reaped during it), % of one core
    res["pgbench_cpu_pct"] = ((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / elapsed * 100
                              if elapsed > 0 else None)
    res["host_cpu_busy_pct"] = cpu_share_pct(hc0, hc1, "busy")
    # a VM's lost time: a host that runs other guests on our cores shows here
    res["host_cpu_steal_pct"] = cpu_share_pct(hc0, hc1, "steal")
    res.update(wal_counter_deltas(wal0, wal1, res.get("transactions")))
    sdelta = wal_counter_deltas(swal0, swal1, res.get("transactions"))
    if "wal_io_by_backend" in sdelta:
        res["standby_wal_io_by_backend"] = sdelta["wal_io_by_backend"]
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
        # the emulated wire's own cost (it shares the CPUs with the servers), % of one core
        "proxy_cpu_pct": (sum(pxcpu1[k] - pxcpu0[k] for k in pxcpu1 if k in pxcpu0) / elapsed * 100
                          if pxcpu0 and elapsed > 0 else None),
    })
    return res


def run_groups(cluster, variants: list[Variant], conf: MethodConf, store, scenario: str, run_id: str,
               common: dict, progress=None, deadline: float | None = None, log=None) -> list[dict]:
    """Run every group's variants interleaved, `conf.iterations` times."""
    from .proof import summary

    def prove(first: bool = False) -> dict:
        p = cluster.prove()
        if log and first:  # re-proofs within a group are stored, and only a failure is told
            log("environment proved: " + summary(p))
        return p

    groups: dict[str, list[Variant]] = {}
    for v in variants:
        groups.setdefault(v.group, []).append(v)
    records = []
    for gname, vs in groups.items():
        apply_env(cluster, vs[0].env)
        # nothing is measured under a label that is not in effect (proof.py)
        proved = prove(first=True)
        for it in range(conf.iterations):
            for v in vs:
                if deadline and time.monotonic() > deadline:
                    raise LabError(f"scenario time limit reached in {gname} iteration {it}")
                if apply_env(cluster, v.env):  # only when this variant's environment differs
                    proved = prove()
                # before the settings and after the standby's: a new stream
                # negotiates with them (also after a build switch, which set
                # the standby's settings only once its nodes were up)
                if conf.restart:
                    cluster.restart_all()
                    proved = prove()
                apply_settings(cluster, v.settings)
                if conf.reset_data:
                    v.workload.reset(cluster.primary)
                vacuum_s = v.workload.vacuum(cluster.primary) if conf.vacuum else None
                catchup = quiesce(cluster, conf)
                started = time.time()
                metrics = measure(cluster, v, conf)
                metrics["replay_catchup_before_s"] = catchup
                metrics["vacuum_before_s"] = vacuum_s
                rec = {"scenario": scenario, "run_id": run_id, "group": gname, "variant": v.name,
                       "iteration": it, "started_at": started, "variant_config": v.describe(),
                       "method": conf.asdict(), "metrics": metrics, "proof": proved, **common}
                store.append(rec)
                records.append(rec)
                if progress:
                    progress(f"{gname} / {v.name} #{it + 1}: {metrics.get('tps') or 0:.0f} tps")
    return records


def estimate_seconds(n_runs: int, conf: MethodConf, overhead: float = 3.0) -> float:
    return n_runs * (conf.duration + conf.warmup + conf.settle + overhead)
