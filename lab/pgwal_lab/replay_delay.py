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
"""
from __future__ import annotations

import threading
import time

import numpy as np

QUERY_PRIMARY = "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')"
QUERY_STANDBY = "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')"


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
        self.s_samples: list[tuple[float, float]] = []
        self.stop_ev = threading.Event()
        self.error: str | None = None

    @staticmethod
    def _read(conn, query) -> tuple[float, float]:
        t0 = time.monotonic()
        v = conn.execute(query).fetchone()[0]
        return (t0 + time.monotonic()) / 2, float(v)

    def run(self) -> None:
        try:
            with self.primary.connect() as pc, self.standby.connect() as sc:
                while not self.stop_ev.is_set():
                    self.p_samples.append(self._read(pc, QUERY_PRIMARY))
                    self.s_samples.append(self._read(sc, QUERY_STANDBY))
                    self.stop_ev.wait(self.interval)
        except Exception as e:  # a failed probe leaves the run's other figures alone
            self.error = str(e)[:200]

    def stop(self) -> dict:
        self.stop_ev.set()
        self.join(5)
        d = delays(self.p_samples, self.s_samples) * 1000
        return {"flush_to_replay_ms_p50": float(np.percentile(d, 50)) if d.size else None,
                "flush_to_replay_ms_p90": float(np.percentile(d, 90)) if d.size else None,
                "flush_to_replay_ms_p99": float(np.percentile(d, 99)) if d.size else None,
                "flush_to_replay_samples": int(d.size), "flush_to_replay_error": self.error}
