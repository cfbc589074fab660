"""histories: faults in sequence on one long-lived cluster (history/).

Each history builds the four-node cluster of history/cluster.py, then runs
`steps` steps drawn at random from its seed (history/schedule.py), or the
steps of `schedule` as given (a replay), judging the cluster after each
step (history/verdict.py).  The first failed verdict ends the history; its
nodes' logs are kept next to the results, and with `shrink` on the schedule
is cut down to a minimal one that still fails the same way
(history/shrink.py), printed as the command that replays it.

Levels: every synchronous_commit level the server has (sync_levels), and
`on` with early release where the server has commit_early_release (the lock
release then comes before both the local flush and the standby's
acknowledgement), each step at one drawn at random.  stream_unflushed_wal starts at `written`
and the flush workers off where the server has them, summarize_wal off;
`uw`, `fw` and `summarize` steps change them.
"""
from __future__ import annotations

import random
import shlex
import time
from collections import Counter
from pathlib import Path

from .. import topology
from ..audit import faults
from ..audit.ledger import READER_KINDS, SCHEMA
from ..history import schedule as sched
from ..history import shrink, verdict
from ..history.cluster import HistoryCluster
from ..history.logscan import LogScanner
from ..history.steps import run_step, target_state
from ..util import LabError
from . import Context, as_list, sync_levels
from .audit import SETTINGS as AUDIT_SETTINGS

NAME = "histories"
DEFAULTS = {"histories": 10, "steps": 8, "seed": 1, "schedule": "", "levels": "auto", "net": "1ms",
            "wal_fsync_ms": 1, "shrink": True, "shrink_budget": 40, "server_settings": {}, "choices": 3,
            "faults": 0}
# choices: how many candidate steps a draw compares: the one whose cell of
# the coverage matrix (kind, role of the node, features there, level) ran
# least in this run is taken; 1 draws without weighting.
# faults: when > 0, a history runs until that many of its steps were faults
# (schedule.FAULTS), whatever `steps` says.
SMOKE = {"histories": 1, "steps": 4, "shrink": False}

SETTINGS = {**AUDIT_SETTINGS, "archive_mode": "always", "wal_keep_size": "512MB",
            "max_wal_size": "256MB", "checkpoint_timeout": "60s"}


def _settings(bin_dir) -> tuple[dict, bool, bool, bool, bool]:
    sample = topology.server_settings_sample(bin_dir)
    s = dict(SETTINGS)
    has_uw = "stream_unflushed_wal" in sample
    has_fw = "wal_receiver_flush_worker" in sample
    if "wal_receiver_accept_unflushed" in sample:
        s["wal_receiver_accept_unflushed"] = "on"
    if has_uw:
        s["stream_unflushed_wal"] = "written"
    return s, has_uw, has_fw, "durable_snapshots" in sample, "summarize_wal" in sample


def replay_command(bin_dir, steps) -> str:
    return (f"lab/pgwal-lab run histories --bin {shlex.quote(str(bin_dir))} "
            f"--set schedule={shlex.quote(sched.format_schedule(steps))}")


def cell(step: sched.Step, target: dict) -> tuple:
    """A step's cell of the coverage matrix: kind, the role of the node it
    hits and the features there (steps.target_state), and level."""
    return (step.kind, target.get("role", "?"), target.get("features", "?"), step.level)


def draw(rng: random.Random, st: sched.State, levels: list, hc: HistoryCluster, covered: Counter,
         choices: int) -> sched.Step:
    """The next step: of `choices` candidates drawn from the seed, the one
    whose cell ran least so far (the first of equals), so that a run's
    draws spread over the cells not yet covered: every standby as the
    synchronous one with each of its features, at each level.  The same
    seed with the same earlier histories of the run draws the same steps;
    a history's record holds its schedule, which replays exactly."""
    cands = [sched.next_step(rng, st, levels) for _ in range(max(1, choices))]
    if len(cands) == 1:
        return cands[0]
    sync_name = hc.sync_standby()
    return min(cands, key=lambda c: covered[cell(c, target_state(hc, c, sync_name))])


def opening(seed: int | None, st: sched.State, levels: list) -> list:
    """The steps a drawn history opens with, before its seed's draws: half
    of the histories turn the flush worker on at one standby (the
    synchronous one in half of those), so that its hand-off meets the other
    faults from the start; a `fw` step drawn later came in about one
    history in three.  From a generator of the seed's own, so that the
    seed's other draws stay as they were."""
    if seed is None or not st.has_fw or not st.standbys:
        return []
    side = random.Random(seed * 7_919 + 17)
    if side.random() >= 0.5:
        return []
    sync = st.sync_standby()
    node = sync if sync and side.random() < 0.5 else side.choice(sorted(st.standbys))
    return [sched.Step("fw", (node, "on"), side.choice(levels), side.randint(300, 800))]


def run_history(bin_dir, seed: int | None, steps_wanted: int, given: list | None, levels_param,
                net: str, wal_fsync_ms: float, logs_dir: Path | None, log=print,
                server_settings: dict | None = None, covered: Counter | None = None,
                choices: int = 1, faults_wanted: int = 0) -> dict:
    """One history on a fresh cluster: drawn from `seed`, or the `given`
    steps: `steps_wanted` steps, or with `faults_wanted` until that many of
    them were faults (schedule.FAULTS; settings, rebuilds and rejoins do not
    count).  `covered` counts the cells of the run's steps so far (updated
    here); with `choices` > 1 draws favour the cells it counts least.
    Returns its record: the steps run, each step's record, and the failure
    (None when every verdict held)."""
    covered = Counter() if covered is None else covered
    settings, has_uw, has_fw, has_durable, has_summarize = _settings(bin_dir)
    settings.update(server_settings or {})  # the tests break promises on purpose with fsync = off
    faults.become_subreaper()
    rng = random.Random(seed)
    out: dict = {"seed": seed, "steps": [], "skipped": [], "failure": None}
    t0 = time.monotonic()
    with HistoryCluster(bin_dir, settings, net=net, wal_fsync_ms=wal_fsync_ms) as hc:
        if levels_param == "auto":
            levels = sync_levels(hc.primary)
            if "local_non_durable_reads" in levels:  # the server has commit_early_release
                levels.insert(levels.index("on") + 1, "on+early_release")
        else:
            levels = [str(x) for x in as_list(levels_param)]
        readers = [r for r in READER_KINDS if r != "durable" or has_durable]
        hc.primary.sql(SCHEMA)
        out["server_version"] = hc.primary.scalar("SHOW server_version")
        out["proof"] = hc.proof
        verdict.check_liveness(hc)
        scanner = LogScanner()
        verdict.check_logs(hc, scanner)  # the start-up: judged too
        ledgers = []
        todo = list(given) if given is not None else None
        opened = [] if todo is not None else opening(seed, hc.state(has_uw, has_fw, has_summarize), levels)
        index = drawn = 0
        while True:
            st = hc.state(has_uw, has_fw, has_summarize)
            if todo is not None:
                if not todo:
                    break
                step = todo.pop(0)
                why = sched.applicable(step, st)
                if why:
                    out["skipped"].append(f"{step}: {why}")
                    continue
            else:
                # long enough: `steps` steps, or with `faults` that many faults
                enough = (sum(sched.Step.parse(t).kind in sched.FAULTS for t in out["steps"]) >= faults_wanted
                          if faults_wanted else drawn >= steps_wanted)
                if enough and not st.down:
                    break
                # past the wanted length only the rejoin that ends a history is drawn
                if opened:
                    step = opened.pop(0)
                else:
                    step = (sched.Step("rejoin", (st.down[0],), rng.choice(levels), rng.randint(300, 1500))
                            if enough else draw(rng, st, levels, hc, covered, choices))
                    drawn += 1
            index += 1
            out["steps"].append(str(step))
            srec: dict = {"step": index, "text": str(step)}
            try:
                srec = run_step(hc, step, index, readers)
                load = srec.pop("load")
                ledgers.append((load, step.level))
                if srec["errors_before_fault"]:
                    raise verdict.Failure(f"void: sessions failed while the cluster should serve: "
                                          f"{srec['errors_before_fault'][:3]}")
                srec.update(verdict.check_ledgers(hc, ledgers, srec["label"]))
                srec.update(verdict.check_liveness(hc))
                srec.update(verdict.check_convergence(hc))
                if "killed" in srec:  # kill-proc: that node's reinitialization is the step's own doing
                    scanner.expect_kill(*srec["killed"])
                if "disk_full_mb" in srec:
                    scanner.expect_disk_full(step.args[0])
                srec.update(verdict.check_logs(hc, scanner))
            except verdict.Failure as f:
                out["failure"] = {"step": index, "kind": f.kind, "message": str(f)}
            except LabError as e:
                # an operation the cluster refused (a node that cannot start,
                # pg_rewind failing): a liveness failure of the history
                first = str(e).splitlines()[0][:300]
                out["failure"] = {"step": index, "kind": "liveness", "message": f"liveness: {first}",
                                  "detail": str(e)[-3000:]}
            except Exception as e:  # noqa: BLE001 - a defect of the explorer: recorded, the batch goes on
                import traceback

                out["failure"] = {"step": index, "kind": "lab", "message": f"lab: {type(e).__name__}: {e}"[:300],
                                  "detail": traceback.format_exc()[-3000:]}
            out.setdefault("records", []).append({k: v for k, v in srec.items() if k != "load"})
            covered[cell(step, srec)] += 1
            log(f"history {seed if seed is not None else 'replay'} step {index}: {step}"
                + (f" FAILED: {out['failure']['message'][:300]}" if out["failure"] else ""))
            if out["failure"]:
                if logs_dir is not None:
                    dest = logs_dir / f"history-{seed if seed is not None else 'replay'}-{int(time.time())}"
                    hc.keep_logs(dest)
                    out["failure"]["logs"] = str(dest)
                break
    out["seconds"] = round(time.monotonic() - t0, 1)
    out["levels"] = levels
    return out


def run(ctx: Context, params: dict) -> list[dict]:
    logs_dir = Path(ctx.store.path).parent / "logs"
    given = sched.parse_schedule(str(params["schedule"])) if params["schedule"] else None
    n = 1 if given is not None else int(params["histories"])
    if ctx.set_total:
        ctx.set_total(n, None)
    records = []
    covered: Counter = Counter()  # the run's cells so far, for the draws
    for i in range(n):
        if ctx.deadline and time.monotonic() > ctx.deadline - 60:
            ctx.log(f"histories: time limit reached after {i} of {n} histories")
            break
        seed = None if given is not None else int(params["seed"]) + i
        h = run_history(ctx.bin_dir, seed, int(params["steps"]), given, params["levels"], str(params["net"]),
                        float(params["wal_fsync_ms"]), logs_dir, log=ctx.log,
                        server_settings=params["server_settings"], covered=covered, choices=int(params["choices"]),
                        faults_wanted=int(params["faults"]))
        h["replay"] = replay_command(ctx.bin_dir, [sched.Step.parse(s) for s in h["steps"]])
        if h["failure"] and h["failure"]["kind"] != "lab" and params["shrink"] and given is None:
            ctx.log(f"histories: history {seed} failed ({h['failure']['kind']}); shrinking {len(h['steps'])} steps")
            minimal, tries = shrink.shrink(
                [sched.Step.parse(s) for s in h["steps"]], h["failure"]["kind"],
                lambda steps: run_history(ctx.bin_dir, None, 0, steps, params["levels"], str(params["net"]),
                                          float(params["wal_fsync_ms"]), None, log=lambda *_: None,
                                          server_settings=params["server_settings"]),
                budget=int(params["shrink_budget"]), log=ctx.log)
            h["shrunk"] = {"steps": [str(s) for s in minimal], "replays": tries,
                           "replay": replay_command(ctx.bin_dir, minimal)}
            ctx.log(f"histories: minimal schedule ({len(minimal)} steps, {tries} replays): "
                    f"{h['shrunk']['replay']}")
        rec = dict(ctx.common, scenario=NAME, group="history", variant=f"seed {seed}" if seed is not None else "replay",
                   run_id=ctx.run_id, params=params, **h)
        ctx.store.append(rec)
        records.append(rec)
        if ctx.progress:
            ctx.progress(f"history {seed if seed is not None else '(replay)'}: {len(h['steps'])} steps in {h['seconds']} s"
                         + (f" FAILED at step {h['failure']['step']}: {h['failure']['message'][:200]}"
                            if h["failure"] else ", every verdict held"))
    return records


def failures(records: list[dict]) -> str | None:
    bad = [f"history {r.get('seed')} step {r['failure']['step']} ({r['steps'][r['failure']['step'] - 1]}): "
           f"{r['failure']['message'][:300]}" for r in records if r.get("scenario") == NAME and r.get("failure")]
    return "; ".join(bad[:5]) or None
