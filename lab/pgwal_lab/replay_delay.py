"""How long after the primary flushed WAL a standby has replayed it.

pg_stat_replication.replay_lag starts its clock when the walsender sends
WAL.  With stream_unflushed_wal = written that is before the primary's
fsync, and the standby replays only once the primary's flush position has
arrived, so the column then includes the fsync: the same delay reads
higher.  This sampler measures from outside the servers, with one origin
for every mode: every `interval` seconds it reads the primary's flush
position and the standby's replay position (two connections, one thread,
each reading timed by the midpoint of its query).  For each primary sample
(t, F), the delay is the time of the first standby sample at or after t
whose replay position is at least F, minus t.  The sampling interval
bounds the resolution; the bias is the same for every variant, and a
median over thousands of samples with unaligned phases averages it out.
The queries cost CPU (both connections, 1/interval each), so it is off
unless asked for (MethodConf.replay_probe_s).

The same standby query also reads where the WAL stood on its way (HOPS):
written and flushed by the walreceiver, the primary's flush position it
has heard (`upstream_flush_lsn`, patch 0006; NULL unless the stream
carries it), usable by the startup process, and replayed.  Each hop gets
the same delay from the primary's flush, so a slow replay can be placed:
waiting for the standby's own flush, for the primary's flush position, or
for the replay itself.  No SQL function shows the usable position itself
(`pg_last_wal_receive_lsn()` shows the local flush, uncapped, since 0006):
it is the lesser of the local flush and the heard primary flush, both read
in the same row.

The replay itself is described by two more figures: the backlog (usable
minus replayed, at each standby sample) and, for each primary flush, the
release backlog: how much WAL up to it was still to replay when it became
usable.  With the startup process's CPU time per replayed byte (method.py)
it tells whether the wait from usable to replayed is the replay's own work.
"""
from __future__ import annotations

import threading
import time

import numpy as np

QUERY_PRIMARY = "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')"
# the order of HOPS; a NULL position (no walreceiver, no such column) is never reached
HOPS = ("written", "flushed", "upstream_flush", "usable", "replay")
_QUERY_STANDBY = """SELECT (SELECT pg_wal_lsn_diff(written_lsn, '0/0') FROM pg_stat_wal_receiver),
       (SELECT pg_wal_lsn_diff(flushed_lsn, '0/0') FROM pg_stat_wal_receiver),
       {upstream},
       pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')"""
HAS_UPSTREAM = ("SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'pg_stat_wal_receiver'::regclass "
                "AND attname = 'upstream_flush_lsn')")


def standby_query(has_upstream: bool) -> str:
    return _QUERY_STANDBY.format(upstream="(SELECT pg_wal_lsn_diff(upstream_flush_lsn, '0/0') "
                                 "FROM pg_stat_wal_receiver)" if has_upstream else "NULL")


def hop_positions(row) -> tuple[float, ...]:
    """One standby row (written, flushed, upstream_flush, replay) as the
    positions of HOPS; a NULL position is -inf, never reached.  Usable is
    the local flush, capped by the heard primary flush when the stream
    carries it (what WalRcvPublishFlushedUpto publishes)."""
    written, flushed, upstream, replay = (float("-inf") if x is None else float(x) for x in row)
    usable = flushed if row[2] is None else min(flushed, upstream)
    return written, flushed, upstream, usable, replay


def replay_backlog(primary: list[tuple[float, float]], usable: list[tuple[float, float]],
                   replay: list[tuple[float, float]]) -> dict:
    """The backlog (usable minus replayed, kB) over all standby samples, and
    for each primary flush F what was still to replay up to F when F became
    usable (F minus replayed, kB, at the first standby sample that had F
    usable): the replay work that stood between F's release and its replay."""
    out = {"replay_backlog_kb_p50": None, "replay_backlog_kb_p90": None,
           "release_backlog_kb_p50": None, "release_backlog_kb_p90": None}
    if not usable or not primary:
        return out
    ts = np.asarray([x[0] for x in usable], dtype=float)
    u = np.maximum.accumulate(np.asarray([x[1] for x in usable], dtype=float))
    r = np.maximum.accumulate(np.asarray([x[1] for x in replay], dtype=float))
    backlog = np.maximum(u - r, 0)[np.isfinite(u) & np.isfinite(r)] / 1024
    if backlog.size:
        out["replay_backlog_kb_p50"], out["replay_backlog_kb_p90"] = (float(np.percentile(backlog, q))
                                                                      for q in (50, 90))
    tp, fp = (np.asarray(x, dtype=float) for x in zip(*primary))
    k = np.maximum(np.searchsorted(ts, tp, side="left"), np.searchsorted(u, fp, side="left"))
    reached = k < len(ts)
    ahead = np.maximum(fp[reached] - r[k[reached]], 0)
    ahead = ahead[np.isfinite(ahead)] / 1024
    if ahead.size:
        out["release_backlog_kb_p50"], out["release_backlog_kb_p90"] = (float(np.percentile(ahead, q))
                                                                        for q in (50, 90))
    return out


def delays(primary: list[tuple[float, float]], standby: list[tuple[float, float]]) -> np.ndarray:
    """Seconds from each primary sample (time, flush) to the first standby
    sample (time, replay) at or after it with replay >= flush; primary
    samples that no standby sample reached are left out."""
    if not primary or not standby:
        return np.asarray([], dtype=float)
    tp, fp = (np.asarray(x, dtype=float) for x in zip(*primary))
    ts, rs = (np.asarray(x, dtype=float) for x in zip(*standby))
    rs = np.maximum.accumulate(rs)  # replay positions only grow; keep the search sorted
    k = np.maximum(np.searchsorted(ts, tp, side="left"), np.searchsorted(rs, fp, side="left"))
    reached = k < len(ts)
    return ts[k[reached]] - tp[reached]


class ReplayDelaySampler(threading.Thread):
    def __init__(self, primary, standby, interval: float = 0.002):
        super().__init__(daemon=True)
        self.primary, self.standby, self.interval = primary, standby, interval
        self.p_samples: list[tuple[float, float]] = []
        # one list of (time, position) per hop, in the order of HOPS
        self.s_samples: list[list[tuple[float, float]]] = [[] for _ in HOPS]
        self.stop_ev = threading.Event()
        self.error: str | None = None

    @staticmethod
    def _read(conn, query) -> tuple[float, tuple]:
        t0 = time.monotonic()
        row = conn.execute(query).fetchone()
        return (t0 + time.monotonic()) / 2, row

    def run(self) -> None:
        try:
            with self.primary.connect() as pc, self.standby.connect() as sc:
                query = standby_query(bool(sc.execute(HAS_UPSTREAM).fetchone()[0]))
                while not self.stop_ev.is_set():
                    t, (flush,) = self._read(pc, QUERY_PRIMARY)
                    self.p_samples.append((t, float(flush)))
                    t, row = self._read(sc, query)
                    for samples, pos in zip(self.s_samples, hop_positions(row)):
                        samples.append((t, pos))
                    self.stop_ev.wait(self.interval)
        except Exception as e:  # a failed probe leaves the run's other figures alone
            self.error = str(e)[:200]

    def stop(self) -> dict:
        self.stop_ev.set()
        self.join(5)
        out: dict = {}
        for hop, samples in zip(HOPS, self.s_samples):
            d = delays(self.p_samples, samples) * 1000
            for q in (50, 90, 99):
                out[f"flush_to_{hop}_ms_p{q}"] = float(np.percentile(d, q)) if d.size else None
            out[f"flush_to_{hop}_samples"] = int(d.size)
        out.update(replay_backlog(self.p_samples, self.s_samples[HOPS.index("usable")],
                                  self.s_samples[HOPS.index("replay")]))
        out["flush_to_replay_error"] = self.error
        return out
