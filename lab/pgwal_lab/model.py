"""The commit latency model of unflushed-WAL streaming (docs/design/unflushed-wal.md).

One commit of one client, with the primary's WAL write `w` and fsync `F_p`,
the link's round trip `RTT` and the standby's work `S` before it replies:

    stock (the primary sends flushed WAL):     w + F_p + RTT + S
    stream_unflushed_wal = written:            w + max(F_p, RTT + S)

S is 0 for remote_receive, the standby's WAL write for remote_write (when
the standby replies after writing: wal_receiver_reply_events has "write";
otherwise its write position reaches the primary with the flush reply) and
write + fsync for on.  Every input comes from what the lab proved before
the group's first run: the fsync shim's probe on each node (fdatasync and
pwrite medians, as the server user, on the node's file system) and the
round trip through the delay proxy.  The bar (issue 19): within ±15 %
of the model, or ±0.3 ms where 15 % is less.

The probes are single small writes and fsyncs, so the model leaves out the
primary's own work around them: the COMMIT statement's round trip from the
client, the commit record, the transaction's real WAL write, waking the
walsender and the backend.  On this machine that is 0.2-0.5 ms, which
alone breaks the ±0.3 ms tolerance of the 2 ms cells.  The calibrated form
measures that term instead of leaving it out: a `local` variant run in the
same group (same primary, same unflushed mode) waits for nothing but the
primary, so its COMMIT latency L is that work plus F_p, and

    stock:                                     L + RTT + S
    stream_unflushed_wal = written:            L - F_p + max(F_p, RTT + S)
"""
from __future__ import annotations

TOLERANCE = 0.15
TOLERANCE_MS = 0.3


def inputs(proof: dict, standby: str = "s1", reply_events: str | None = None) -> dict | None:
    """Model inputs in ms from a group's proof; None if it lacks a probe or a link."""
    nodes = (proof or {}).get("nodes", {})
    p, s = nodes.get("primary", {}), nodes.get(standby, {})
    pp, sp, link = p.get("disk", {}).get("probe"), s.get("disk", {}).get("probe"), s.get("link")
    if not pp or not sp or not link or not link.get("rtt_ms_median"):
        return None
    # the standby's setting as the proof saw it; runs from before the proof
    # recorded it had the lab's old default 'receive, flush'
    proved = s.get("settings", {}).get("wal_receiver_reply_events")
    events = [e.strip() for e in (proved or reply_events or "receive, flush").split(",")]
    return {"w": pp["pwrite_us_median"] / 1000, "F_p": pp["fdatasync_us_median"] / 1000,
            "rtt": link["rtt_ms_median"], "W_s": sp["pwrite_us_median"] / 1000,
            "F_s": sp["fdatasync_us_median"] / 1000, "write_reply": "write" in events}


def standby_work(level: str, inp: dict) -> float:
    """S: what the standby does before the reply a commit at `level` waits for."""
    if level == "remote_receive":
        return 0.0
    if level == "remote_write" and inp["write_reply"]:
        return inp["W_s"]
    if level in ("remote_write", "on"):
        return inp["W_s"] + inp["F_s"]
    raise ValueError(f"the model has no standby wait for level {level!r}")


def predict(level: str, unflushed: bool, inp: dict) -> float:
    """Predicted COMMIT latency in ms."""
    remote = inp["rtt"] + standby_work(level, inp)
    return inp["w"] + (max(inp["F_p"], remote) if unflushed else inp["F_p"] + remote)


def predict_calibrated(level: str, unflushed: bool, inp: dict, local_ms: float) -> float:
    """Predicted COMMIT latency in ms, from the measured COMMIT latency
    `local_ms` of `synchronous_commit = local` in the same group and mode."""
    remote = inp["rtt"] + standby_work(level, inp)
    return local_ms - inp["F_p"] + max(inp["F_p"], remote) if unflushed else local_ms + remote


def fits(measured: float, predicted: float) -> bool:
    return abs(measured - predicted) <= max(TOLERANCE * predicted, TOLERANCE_MS)
