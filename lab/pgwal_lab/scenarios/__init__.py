"""Named scenarios.  Each module has DEFAULTS, SMOKE (a seconds-long
version for tests) and run(ctx, params) -> list of stored records."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..method import MethodConf
from ..util import IN_CHECKOUT, REPO, LabError

# canonical order, weakest promise first; unknown levels go before "on"
LEVEL_ORDER = ["off", "local", "local_non_durable_reads", "remote_receive", "remote_write", "on", "remote_apply"]

# Lab names for levels the server spells with two settings.  The patched
# server has no synchronous_commit = local_non_durable_reads (the name of a
# 2018 experiment); the lab keeps the name, which labels the early-release
# results in docs/results, for local with commit_early_release.
LEVEL_ALIASES = {"local_non_durable_reads": {"synchronous_commit": "local", "commit_early_release": "on"}}


def level_gucs(level: str) -> dict:
    """The server settings of a level name (an alias or a synchronous_commit value)."""
    return dict(LEVEL_ALIASES.get(level, {"synchronous_commit": level}))


def sync_levels(node) -> list[str]:
    """Every level the server offers, in promise order: its synchronous_commit
    values, and the lab's aliases for those combined with commit_early_release
    where the server has that setting."""
    vals = node.scalar("SELECT enumvals FROM pg_settings WHERE name = 'synchronous_commit'")
    vals = [v for v in vals if v not in ("true", "false", "yes", "no", "1", "0")]
    if node.scalar("SELECT count(*) FROM pg_settings WHERE name = 'commit_early_release'") == 1:
        vals += [a for a, gucs in LEVEL_ALIASES.items()
                 if a not in vals and gucs["synchronous_commit"] in vals]
    known = [v for v in LEVEL_ORDER if v in vals]
    extra = [v for v in vals if v not in LEVEL_ORDER]
    return known[: known.index("on")] + extra + known[known.index("on"):] if "on" in known else known + extra


@dataclass
class Context:
    bin_dir: Path
    store: object
    run_id: str
    common: dict
    progress: Callable | None = None      # progress(message) after each run
    set_total: Callable | None = None     # set_total(n_runs, seconds_per_run)
    deadline: float | None = None
    log: Callable = print
    extra: dict = field(default_factory=dict)

    def check_deadline(self, what: str) -> None:
        if self.deadline and time.monotonic() > self.deadline:
            raise LabError(f"time limit reached before {what}")

    def run_variants(self, cluster, scenario: str, variants: list, conf: MethodConf, workload, topology: str,
                     params: dict) -> list[dict]:
        """The common end of a scenario: announce the run count, load the
        workload's data, then run the variants' groups interleaved."""
        from ..method import run_groups
        if self.set_total:
            self.set_total(len(variants) * conf.iterations, conf)
        workload.init(cluster.primary, self.bin_dir)
        common = dict(self.common, server_version=cluster.server_version(), topology=topology,
                      namespaces=cluster.use_ns, params=params)
        return run_groups(cluster, variants, conf, self.store, scenario, self.run_id, common, self.progress,
                          self.deadline, self.log)


def as_list(v) -> list:
    """A parameter that may come as a list, a comma string or a scalar."""
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return [v]


def as_bool(v, name: str) -> bool:
    """A flag from --set (JSON true/false, or a word); anything else is an error."""
    if isinstance(v, bool):
        return v
    word = str(v).strip().lower()
    if word in ("true", "on", "yes", "1"):
        return True
    if word in ("false", "off", "no", "0"):
        return False
    raise LabError(f"{name}: expected true or false, got {v!r}")


def method_conf(params: dict) -> MethodConf:
    return MethodConf(iterations=int(params["iterations"]), duration=float(params["duration"]),
                      warmup=float(params["warmup"]), settle=float(params["settle"]),
                      reset_data=as_bool(params.get("reset_data", False), "reset_data"),
                      # fresh processes before every run; on by default when
                      # a run switches builds (baseline=stock, compare_bin)
                      restart=as_bool(params.get("restart", str(params.get("baseline") or "none") not in
                                                 ("none", "off", "") or bool(params.get("compare_bin"))),
                                      "restart"),
                      vacuum=as_bool(params.get("vacuum", True), "vacuum"),
                      wait_sample_s=float(params.get("wait_sample_s", 0.2)),
                      replay_probe_s=float(params.get("replay_probe_ms", 0)) / 1000)


def get(name: str):
    from . import (audit, audit_consumer, audit_receiver, histories, hot_counter, large_txn, sync_modes, tpcb_simple,
                   wal_volume)

    mods = {"sync-modes": sync_modes, "hot-counter": hot_counter, "tpcb-simple": tpcb_simple,
            "wal-volume": wal_volume, "large-txn": large_txn, "audit": audit, "audit-consumer": audit_consumer,
            "audit-receiver": audit_receiver, "histories": histories}
    if name not in mods:
        raise LabError(f"unknown scenario {name!r} (known: {', '.join(mods)})")
    return mods[name]


NAMES = ["sync-modes", "hot-counter", "tpcb-simple", "wal-volume", "large-txn", "audit", "audit-consumer",
         "audit-receiver", "histories"]


STOCK_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")


def baseline_build(params: dict, existing) -> Path | None:
    """The bin dir of the unpatched build the patched levels are measured
    against (--set baseline=stock), or None: baseline_bin, else
    $PGWAL_LAB_BASELINE_BIN, else the checkout's stock-bench flavour."""
    which = str(params.get("baseline") or "none")
    if which in ("none", "off", ""):
        return None
    if which != "stock":
        raise LabError(f"baseline: expected stock or none, got {which!r}")
    if existing:
        raise LabError("a baseline needs a lab-made cluster (both builds run its data directories)")
    default = REPO / ".build" / "install" / "stock-bench" / "bin" if IN_CHECKOUT else None
    from ..proof import read_build_info

    bin_dir = Path(params.get("baseline_bin") or os.environ.get("PGWAL_LAB_BASELINE_BIN") or default or "")
    if not (bin_dir / "postgres").exists():
        raise LabError(f"baseline: no postgres in {bin_dir} (build it: server/pg build --flavour stock-bench, "
                       "or give --set baseline_bin=DIR)")
    if read_build_info(bin_dir):
        raise LabError(f"baseline: {bin_dir} holds pgwal's patched build (PGWAL-BUILD), not stock")
    return bin_dir.resolve()


def series_label(bin_dir: Path) -> str:
    """A patched build's name in variant labels: the number of the last patch
    it was built with, from its PGWAL-BUILD ("0010"), or its flavour."""
    from ..proof import read_build_info

    info = read_build_info(bin_dir)
    patches = info.get("patches", "").split()
    return patches[-1][:4] if patches else info.get("flavour", "patched")


def compare_build(params: dict, bin_dir: Path, existing) -> Path | None:
    """The bin dir of a second patched build to interleave with the build
    under test (--set compare_bin=DIR, e.g. the series up to the patch before
    the one measured: server/pg build --flavour bench --upto NNNN), or None.
    Both must be patched builds (PGWAL-BUILD) whose series end in different
    patches, so that each variant's label, the last patch of its build, says
    which ran."""
    which = params.get("compare_bin")
    if not which:
        return None
    if existing:
        raise LabError("compare_bin needs a lab-made cluster (both builds run its data directories)")
    from ..proof import read_build_info

    other = Path(str(which)).resolve()
    if not (other / "postgres").exists():
        raise LabError(f"compare_bin: no postgres in {other}")
    mine, theirs = read_build_info(bin_dir), read_build_info(other)
    if not theirs:
        raise LabError(f"compare_bin: {other} is not a patched build (no PGWAL-BUILD); "
                       "for stock PostgreSQL use --set baseline=stock")
    if not mine:
        raise LabError(f"compare_bin: the build under test, {bin_dir}, is not a patched build")
    if series_label(bin_dir) == series_label(other):
        raise LabError(f"compare_bin: {other} was built with the same series as {bin_dir} "
                       f"(both end in patch {series_label(other)})")
    return other


def baseline_levels(params: dict, default: str) -> list[str]:
    """The stock build's levels of a baseline run (--set baseline_levels)."""
    levels = as_list(params.get("baseline_levels") or default)
    bad = [lvl for lvl in levels if lvl not in STOCK_LEVELS]
    if bad:
        raise LabError(f"baseline_levels: stock PostgreSQL has no level {', '.join(bad)}")
    return levels
