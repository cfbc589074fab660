"""tpcb-simple: low-contention TPC-B, `pgbench -N` (builtin simple-update:
the accounts UPDATE, a SELECT and the history INSERT, no branches/tellers
updates), scale 100 (10 M accounts), on a primary alone with its WAL fsync
slowed by the shim, comparing synchronous_commit 'on', 'off' and
local_non_durable_reads (when the server has it): the no-regression check
for early lock release where rows hardly ever collide.  Levels take the
same '+' modifiers as hot-counter.  One group per (fsync, clients)."""
from __future__ import annotations

from ..workloads import tpcb
from . import Context
from .hot_counter import run_matrix

NAME = "tpcb-simple"
DEFAULTS = {"scale": 100, "clients": [8, 32], "fsync_ms": [0.2], "levels": "auto", "disk_mb": 8192,
            "iterations": 10, "duration": 20, "warmup": 3, "settle": 5}
SMOKE = {"scale": 1, "clients": [4], "fsync_ms": [0.2], "disk_mb": 3072, "iterations": 1, "duration": 1,
         "warmup": 0, "settle": 0}


def run(ctx: Context, params: dict) -> list[dict]:
    return run_matrix(ctx, params, NAME, tpcb(int(params["scale"]), skip_some=True),
                      disk_mb=int(params.get("disk_mb") or 0) or None)
