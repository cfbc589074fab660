"""hot-counter: one-row counter UPDATE on a primary alone, for several
client counts and primary WAL fsync latencies (shim on pg_wal only),
comparing synchronous_commit 'on' vs 'off' (and local_non_durable_reads
when the server has it).  One group per (fsync, clients, readers).

A level may carry modifiers after '+': `+durable_snapshots` sets
durable_snapshots = on for every session (ALTER SYSTEM: the writers'
UPDATE snapshots wait for early-released commits too), `+durable_readers`
only for the reader clients (their sessions start with it), and
`+commit_early_release` sets commit_early_release = on.  `readers` (a list,
default 0) adds that many clients running `SELECT counter` in a second
pgbench alongside the writers; their TPS and latency are reported as
read_*, the writers' as tps/lat_*.  `+durable_readers` variants are only
run in groups with readers.

--set baseline=stock adds the levels in baseline_levels (default on,off)
run on the unpatched build of the same source (sync-modes explains the
baseline); variant names then say the build ('stock:on',
'pgwal:on+commit_early_release')."""
from __future__ import annotations

from .. import topology
from ..method import Variant
from ..util import LabError
from ..workloads import Workload, counter_reader, hot_counter
from . import Context, as_list, baseline_build, baseline_levels, level_gucs, method_conf, sync_levels

NAME = "hot-counter"
DEFAULTS = {"clients": [1, 8, 32, 64, 128], "fsync_ms": [0.2, 1, 10], "levels": "auto", "readers": [0],
            "iterations": 10, "duration": 20, "warmup": 3, "settle": 5}
SMOKE = {"clients": [4], "fsync_ms": [1], "iterations": 1, "duration": 1, "warmup": 0, "settle": 0}

MODIFIERS = {"durable_snapshots": ("settings", "durable_snapshots", "on"),
             "durable_readers": ("reader_settings", "durable_snapshots", "on"),
             "commit_early_release": ("settings", "commit_early_release", "on")}


def disk_for(fsync_ms: float) -> str:
    return f"fsync={int(round(float(fsync_ms) * 1000))},match=pg_wal"


def parse_level(level: str) -> tuple[dict, dict]:
    """'local_non_durable_reads+durable_readers' -> (writer settings, reader session settings)."""
    base, *mods = [x.strip() for x in str(level).split("+")]
    settings, reader = level_gucs(base), {}
    for m in mods:
        if m not in MODIFIERS:
            raise LabError(f"unknown level modifier {m!r} in {level!r} (known: {', '.join(MODIFIERS)})")
        where, guc, val = MODIFIERS[m]
        (settings if where == "settings" else reader)[guc] = val
    return settings, reader


def level_settings(levels: list[str]) -> dict[str, tuple[dict, dict]]:
    """Settings per level; a GUC that any level sets is set explicitly (to
    off) by every other level, so ALTER SYSTEM from one variant never leaks
    into the next."""
    parsed = {lvl: parse_level(lvl) for lvl in levels}
    gucs = {g for s, _ in parsed.values() for g in s if g != "synchronous_commit"}
    for s, _ in parsed.values():
        for g in gucs:
            s.setdefault(g, "off")
    return parsed


def matrix_variants(levels: list[str], fsyncs: list[float], clients: list, readers: list, wl: Workload,
                    reader_wl: Workload | None = None, builds: dict | None = None,
                    stock_levels: list[str] | None = None) -> list[Variant]:
    """One group per (fsync, clients, readers).  With `builds` ({"stock":
    bin dir, "pgwal": bin dir}) each group first runs `stock_levels` on the
    stock build, then `levels` on the patched one."""
    parsed = level_settings(levels)
    out = []
    for f in fsyncs:
        for c in clients:
            for r in readers:
                r = int(r)
                group = f"fsync {f:g} ms, {int(c)} clients" + (f", {r} readers" if r else "")
                runs = [("stock", lvl, {"synchronous_commit": lvl}, {}) for lvl in (stock_levels or [])] if builds else []
                runs += [("pgwal" if builds else None, lvl, *parsed[lvl]) for lvl in levels]
                for build, lvl, settings, rset in runs:
                    if rset and not r:
                        continue  # reader-only settings without readers: same as the base level
                    env = {"primary_disk": disk_for(f)}
                    meta = {"level": lvl, "fsync_ms": f, "clients": int(c), "readers": r}
                    if build:
                        env["build"], meta["build"] = str(builds[build]), build
                    out.append(Variant(f"{build}:{lvl}" if build else lvl, group, wl, int(c), dict(settings), env,
                                       meta, readers=r, reader_workload=reader_wl if r else None,
                                       reader_settings=dict(rset)))
    return out


def resolve_levels(params: dict, cluster) -> list[str]:
    if params["levels"] == "auto":
        avail = sync_levels(cluster.primary)
        return ["on", "off"] + [l for l in ("local_non_durable_reads",) if l in avail]
    return [str(x) for x in as_list(params["levels"])]


def run_matrix(ctx: Context, params: dict, name: str, wl: Workload, reader_wl: Workload | None = None,
               disk_mb: int | None = None) -> list[dict]:
    """Shared by hot-counter and tpcb-simple: a primary alone, one group per
    (fsync, clients, readers), the levels interleaved within each group."""
    fs = [float(x) for x in as_list(params["fsync_ms"])]
    baseline = baseline_build(params, None)
    # with a baseline the stock build makes the data directory (see sync-modes)
    spec = topology.ClusterSpec(bin_dir=baseline or ctx.bin_dir, primary_disk=disk_for(fs[0]))
    if disk_mb:
        spec.disk_mb = int(disk_mb)
    conf = method_conf(params)
    readers = as_list(params.get("readers", [0]))
    with topology.Cluster(spec) as cluster:
        if baseline:
            cluster.switch_build(ctx.bin_dir)  # the patched server's levels
        levels = resolve_levels(params, cluster)
        builds = {"stock": baseline, "pgwal": ctx.bin_dir} if baseline else None
        stock = baseline_levels(params, "on,off") if baseline else None
        variants = matrix_variants(levels, fs, as_list(params["clients"]), readers, wl, reader_wl, builds, stock)
        ctx.log(f"{name}: levels {levels}, fsync {fs} ms, clients {params['clients']}, readers {readers}"
                + (f"; baseline: {', '.join(stock)} on {baseline}" if baseline else ""))
        return ctx.run_variants(cluster, name, variants, conf, wl, "primary alone", params)


def run(ctx: Context, params: dict) -> list[dict]:
    return run_matrix(ctx, params, NAME, hot_counter(), counter_reader())
