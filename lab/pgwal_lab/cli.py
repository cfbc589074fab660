"""pgwal-lab command line.

  pgwal-lab list                         scenarios, their defaults, profiles
  pgwal-lab run SCENARIO [options]       run a scenario, store runs, write the report
  pgwal-lab run sync-modes --cluster F   the same on an existing cluster (DSNs in a TOML file)
  pgwal-lab demo                         short sync-modes + hot-counter (~3-5 min)
  pgwal-lab report RUNS.jsonl [--out D]  re-render a report from stored runs
  pgwal-lab fsync-test [--profile P]     pg_test_fsync through the shim
  pgwal-lab proxy-test [--delays MS,..]  the delay proxy's precision and CPU cost
  pgwal-lab up [--standbys N ...]        bring a topology up and hold it
  pgwal-lab clean [--force]              remove leftovers of crashed runs
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from . import cleanup, disk, netem, report, scenarios, shim
from .store import Store, is_busy, machine_facts
from .util import IN_CHECKOUT, REPO, LabError, default_pg_bin, results_dir, run

# Longest wait for the load of a preceding benchmark to decay before a scenario starts.
QUIET_WAIT_S = 180.0


def _parse_value(v: str):
    try:
        return json.loads(v)
    except ValueError:
        if "," in v:
            return [_parse_value(x) for x in v.split(",")]
        return v


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_list(args) -> int:
    for name in scenarios.NAMES:
        mod = scenarios.get(name)
        print(f"{name}: {(mod.__doc__ or '').strip().splitlines()[0]}")
        print(f"    defaults: {mod.DEFAULTS}")
        print(f"    smoke:    {mod.SMOKE}")
    print("disk profiles:", ", ".join(f"{k} ({v.fsync_us:g} us fsync)" for k, v in disk.PROFILES.items()))
    print("net profiles:", ", ".join(f"{k} ({v.up_ms:g}/{v.down_ms:g} ms)" for k, v in netem.PROFILES.items()))
    return 0


def tool_versions(bin_dir: Path) -> dict:
    from . import __version__

    out = {"pgwal_lab": __version__}
    for tool in ("postgres", "pgbench"):
        try:
            out[tool] = run([bin_dir / tool, "--version"], timeout=30).stdout.strip()
        except Exception as e:  # recorded, not fatal
            out[tool] = f"unknown ({e})"
    try:
        from .util import netdelay_binary

        out["pgwal_netdelay"] = str(netdelay_binary())
    except Exception:
        out["pgwal_netdelay"] = None
    return out


def wait_until_quiet(max_seconds: float, log=None, poll: float = 5.0) -> float:
    """Wait (at most max_seconds) for the 1-minute load average to fall to
    half the cores; returns the seconds waited.  The load average decays with
    a one-minute time constant, so right after another benchmark (e.g. the
    previous group of a series) it reads "busy" for a minute or two although
    nothing runs any more; waiting that out keeps the start-of-run facts and
    the report's busy warning about real competition."""
    cpus = os.cpu_count() or 1
    start = time.monotonic()
    told = False
    while is_busy(os.getloadavg()[0], cpus) and time.monotonic() - start < max_seconds:
        if log and not told:
            log(f"load average {os.getloadavg()[0]:.1f} on {cpus} cores: waiting up to "
                f"{max_seconds:.0f} s for it to settle")
            told = True
        time.sleep(poll)
    return time.monotonic() - start


def busy_warning(facts: dict) -> str | None:
    """Why measurements taken now are suspect (1-minute load above half the cores), or None."""
    load, cpus = facts["loadavg"][0], facts["cpus"] or 1
    if is_busy(load, cpus):
        return f"load average {load:.1f} on {cpus} cores: other work competes for the CPUs"
    return None


# scenarios that can run on an existing cluster (--cluster)
CLUSTER_SCENARIOS = ("sync-modes",)


def run_scenario(name: str, bin_dir: Path, overrides: dict, smoke: bool, results: Path,
                 max_minutes: float | None = None, quiet: bool = False,
                 write_report: bool = True, quiet_wait: float = QUIET_WAIT_S,
                 cluster=None) -> tuple[list[dict], Path]:
    """Run a scenario; returns (records, results dir).  Without max_minutes
    the time limit is 1.5 x the estimate (at least 10 minutes).  `cluster`
    (an external.ClusterConf) runs it on an existing cluster instead of a
    lab-made one."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    mod = scenarios.get(name)
    if cluster is not None:
        if name not in CLUSTER_SCENARIOS:
            raise LabError(f"--cluster runs {', '.join(CLUSTER_SCENARIOS)}, not {name}")
        if "profiles" in overrides or "custom_profiles" in overrides:
            raise LabError("--cluster: profiles emulate disks and links, and the lab emulates nothing on an "
                           "existing cluster")
    params = dict(mod.DEFAULTS)
    if smoke:
        params.update(mod.SMOKE)
    params.update(overrides)
    run_id = f"{name}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
    results.mkdir(parents=True, exist_ok=True)
    store = Store(results / "runs.jsonl")
    console = Console(stderr=True, quiet=quiet)
    if not smoke and quiet_wait > 0:
        wait_until_quiet(quiet_wait, console.log)
    facts = machine_facts()
    if busy := busy_warning(facts):
        console.log(f"[yellow]warning: {busy}, numbers will not be trustworthy")
    common = {"machine": facts, "bin_dir": str(bin_dir), "smoke": smoke,
              "versions": tool_versions(bin_dir)}
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        transient=False, disable=quiet)
    task = progress.add_task(name, total=None)

    def set_total(n, conf):
        from .method import estimate_seconds

        progress.update(task, total=n)
        est = estimate_seconds(n, conf) if conf is not None else n * 120
        if max_minutes is None:
            ctx.deadline = time.monotonic() + max(est * 1.5, 600)
        console.log(f"{n} runs, estimated {est / 60:.1f} min; time limit "
                    f"{(ctx.deadline - time.monotonic()) / 60:.0f} min")

    def advance(msg):
        progress.update(task, advance=1)
        console.log(msg)

    ctx = scenarios.Context(bin_dir=bin_dir, store=store, run_id=run_id, common=common, progress=advance,
                            set_total=set_total,
                            deadline=time.monotonic() + (max_minutes if max_minutes else 30) * 60,
                            log=console.log, extra={"cluster": cluster} if cluster is not None else {})
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        with progress:
            records = mod.run(ctx, params)
    finally:
        signal.signal(signal.SIGTERM, old)
    if write_report:
        path = report.render(store.load(), results, title=f"pgwal lab: {name}")
        console.log(f"report: {path}")
    return records, results


def cmd_run(args) -> int:
    overrides = {}
    for kv in args.set or []:
        k, _, v = kv.partition("=")
        overrides[k.replace("-", "_")] = _parse_value(v)
    for k in ("iterations", "duration", "warmup", "settle"):
        if getattr(args, k) is not None:
            overrides[k] = getattr(args, k)
    cluster = None
    if args.cluster:
        from . import external

        cluster = external.load(args.cluster)
    if args.bin:
        bin_dir = Path(args.bin).resolve()
    else:
        bin_dir = cluster.bin_dir if cluster else default_pg_bin()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results = Path(args.results) if args.results else results_dir(f"{args.scenario}-{stamp}")
    try:
        run_scenario(args.scenario, bin_dir, overrides, args.smoke, results, args.max_minutes,
                     quiet_wait=args.quiet_wait, cluster=cluster)
    except KeyboardInterrupt:
        print("interrupted: cluster torn down", file=sys.stderr)
        return 130
    if not args.no_print:
        print((results / "report.md").read_text())
    failed = getattr(scenarios.get(args.scenario), "failures", None)
    if failed and (problems := failed(Store(results / "runs.jsonl").load())):
        print(f"pgwal-lab: {args.scenario} failed: {problems}", file=sys.stderr)
        return 3
    return 0


DEMO = {
    # the slow standby disk is where the levels (and the standby's flush
    # worker, run off and on for each waiting level) differ most
    "sync-modes": {"profiles": ["lan-slow-standby"], "reply_events": ["receive", "write", "flush"], "scale": 5,
                   "iterations": 2, "duration": 4, "warmup": 1, "settle": 1},
    "hot-counter": {"clients": [8, 128], "fsync_ms": [1], "iterations": 2, "duration": 4, "warmup": 1,
                    "settle": 1},
}


def cmd_demo(args) -> int:
    """Short sync-modes + hot-counter (~3-5 min): prints the tables, writes the plots."""
    from .util import REPO

    if args.bin:
        bin_dir = Path(args.bin).resolve()
    elif os.environ.get("PGWAL_LAB_PG_BIN"):
        bin_dir = Path(os.environ["PGWAL_LAB_PG_BIN"])
    elif IN_CHECKOUT and (REPO / ".build/install/bench/bin/postgres").exists():
        bin_dir = REPO / ".build/install/bench/bin"
    else:
        bin_dir = default_pg_bin()
    from . import proof

    if not proof.is_patched_bin(bin_dir) and not args.allow_stock:
        raise LabError(f"{bin_dir} is not pgwal's patched build (no PGWAL-BUILD beside it), and the demo "
                       f"shows the patched server's levels; build it (server/pg build --flavour bench) or "
                       f"pass --allow-stock to run the demo on this server anyway")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results = Path(args.results) if args.results else results_dir(f"demo-{stamp}")
    try:
        for name, params in DEMO.items():
            # short, indicative runs: no waiting for the load to settle
            run_scenario(name, bin_dir, params, False, results, max_minutes=10, write_report=False,
                         quiet_wait=0)
    except KeyboardInterrupt:
        print("interrupted: cluster torn down", file=sys.stderr)
        return 130
    path = report.render(Store(results / "runs.jsonl").load(), results,
                         title="pgwal lab demo (short runs: indicative only)")
    print(path.read_text())
    print(f"report and plots: {results}", file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    recs = []
    for f in args.runs:
        recs += Store(Path(f)).load()
    out = Path(args.out) if args.out else Path(args.runs[0]).parent
    if out.suffix in (".md", ".png") or (out.exists() and not out.is_dir()):
        # the report is several files (report.md and its plots)
        raise LabError(f"--out {out}: give a directory; report.md and the plots are written into it")
    path = report.render(recs, out, title=args.title)
    print(path.read_text())
    return 0


_FDATASYNC = re.compile(r"^\s*fdatasync\s+([\d.]+) ops/sec\s+([\d.]+) usecs/op", re.M)


def fsync_test(bin_dir: Path, profile: str, directory: Path, seconds: int = 1) -> dict:
    """pg_test_fsync with the shim configured by a disk profile; fdatasync us/op."""
    prof = disk.profile(profile)
    directory.mkdir(parents=True, exist_ok=True)
    p = run([bin_dir / "pg_test_fsync", "-s", seconds, "-f", directory / "pgwal_fsync_test.out"],
            env=prof.env() or None, timeout=120)
    m = _FDATASYNC.search(p.stdout)
    return {"profile": prof.name, "fdatasync_us": float(m.group(2)) if m else None, "output": p.stdout}


def cmd_fsync_test(args) -> int:
    bin_dir = Path(args.bin).resolve() if args.bin else default_pg_bin()
    r = fsync_test(bin_dir, args.profile, Path(args.dir))
    print(r["output"] if args.verbose else f"{r['profile']}: fdatasync {r['fdatasync_us']} us/op")
    return 0


def _number_list(text: str, option: str, convert, low: float, high: float, unit: str) -> list:
    """A comma-separated list of numbers in [low, high] (an option's value)."""
    try:
        values = [convert(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LabError(f"{option}: expected comma-separated numbers ({unit}), got {text!r}") from None
    if not values or any(not low <= v <= high for v in values):
        raise LabError(f"{option}: each value must lie in [{low:g}, {high:g}] {unit}")
    return values


def cmd_proxy_test(args) -> int:
    """Ping-pong through the delay proxy at each delay; a markdown table (or JSON)."""
    from . import netem, proxy_check

    delays = _number_list(args.delays, "--delays", float, 0, 1000, "ms")
    spins: list[int | None] = [None]
    if args.spin_us:
        spins = _number_list(args.spin_us, "--spin-us", int, 0, netem.MAX_SPIN_US, "µs")
    if args.rounds < 1:
        raise LabError("--rounds: at least 1")
    if busy := busy_warning(machine_facts()):
        print(f"warning: {busy}: the endpoints will wait for CPU, not only the proxy", file=sys.stderr)
    results = []
    with proxy_check.echo_server() as echo:
        # every (delay, spin) once per round, so a slow minute hits them all
        for _ in range(args.rounds):
            for d in delays:
                for spin in spins:
                    r = proxy_check.measure(echo, d, count=args.count, spin_us=spin)
                    print(proxy_check.summary_line(r), file=sys.stderr)
                    results.append(r)
    print(json.dumps(results, indent=1) if args.json else proxy_check.markdown(results))
    return 0


def cmd_up(args) -> int:
    """Bring a topology up, print how to reach it, hold it for --hold seconds (or until Ctrl-C)."""
    from . import topology

    bin_dir = Path(args.bin).resolve() if args.bin else default_pg_bin()
    standbys = [topology.StandbySpec(f"s{i}", sync=i <= args.sync, disk=args.standby_disk, net=args.net)
                for i in range(1, args.standbys + 1)]
    if args.cascade:
        standbys.append(topology.StandbySpec(f"c{len(standbys) + 1}", sync=False, upstream="s1",
                                             disk=args.standby_disk, net=args.net))
    spec = topology.ClusterSpec(bin_dir=bin_dir, standbys=standbys, primary_disk=args.primary_disk,
                                sync_method=args.sync_method, num_sync=max(1, args.sync))
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        with topology.Cluster(spec) as c:
            for n in c.nodes.values():
                print(f"{n.name}: psql '{n.conninfo()}'  (netns {n.netns or '-'}, disk {n.disk_profile.name}"
                      + (f", link {n.net_profile.name}" if n.upstream else "") + ")")
            # a held cluster may stand in for a user's (--cluster): its labels are proved too
            from .proof import summary

            print(f"environment proved: {summary(c.prove())}", flush=True)
            print(f"holding for {args.hold:g} s (Ctrl-C to stop)", flush=True)
            time.sleep(args.hold)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0


def cmd_clean(args) -> int:
    done = cleanup.clean(force=args.force)
    if not done:
        print("nothing to clean")
    return 0


def cmd_mutants(args) -> int:
    from . import mutants

    chosen = mutants.load(args.only)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.breaks} ({', '.join(m.files)})")
        return 0
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.results) if args.results else results_dir(f"mutants-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    # every kill is checked against the unmutated check build (server/pg build)
    baseline = REPO / ".build" / "install" / "check" / "bin"
    if not (baseline / "postgres").exists():
        raise LabError(f"no unmutated check build in {baseline} to confirm kills against: "
                       "run server/pg build first")
    results = []
    for m in chosen:
        bin_dir = mutants.build(m)
        # round k draws from its own seeds: seed + k * budget onwards
        for k in range(args.rounds):
            r = mutants.hunt(m, bin_dir, args.budget, args.steps, args.seed + k * args.budget, out / "logs",
                             baseline_bin=baseline)
            r["round"] = k + 1
            results.append(r)
            with open(out / "mutants.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"mutant {m.name}" + (f", round {k + 1}" if args.rounds > 1 else "") + ": "
                  + (f"killed by history {r['seed']} step {r['step']} ({r['kind']}) "
                     f"after {r['histories']} histories" if r["killed"]
                     else f"SURVIVED {r['histories']} histories"), flush=True)
    (out / "report.md").write_text(mutants.report(results))
    print(mutants.report(results))
    print(f"results in {out}")
    if any(r.get("baseline_failures") for r in results):
        return 4
    return 0 if all(r["killed"] for r in results) else 3


def cmd_build(args) -> int:
    print(shim.build(force=True))
    print(shim.build_probe(force=True))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pgwal-lab", description="pgwal benchmark lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="scenarios and profiles").set_defaults(fn=cmd_list)
    r = sub.add_parser("run", help="run a scenario")
    r.add_argument("scenario", choices=scenarios.NAMES)
    r.add_argument("--bin", help="PostgreSQL bin dir (default: $PGWAL_LAB_PG_BIN, the 18 check build, or 15)")
    r.add_argument("--smoke", action="store_true", help="seconds-long version (for tests)")
    r.add_argument("--iterations", type=int)
    r.add_argument("--duration", type=float, help="seconds per measured run")
    r.add_argument("--warmup", type=float)
    r.add_argument("--settle", type=float)
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario parameter (JSON or comma list), e.g. --set clients=8,64")
    r.add_argument("--results", help="results directory (default lab/results/SCENARIO-TIME in a checkout, "
                                      "else ./pgwal-lab-results/SCENARIO-TIME)")
    r.add_argument("--cluster", metavar="FILE",
                   help="run on an existing cluster described by a TOML file (DSNs, pgbench, which settings "
                        "may change; see lab/README.md) instead of a lab-made one; sync-modes only")
    r.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S, metavar="SECONDS",
                   help="wait at most this long for the 1-minute load average to fall to half the cores "
                        "before starting (0: start at once; default %(default)s)")
    r.add_argument("--max-minutes", type=float,
                   help="hard time limit for the scenario (default: 1.5 x the estimate, at least 10 min)")
    r.add_argument("--no-print", action="store_true")
    r.set_defaults(fn=cmd_run)
    d = sub.add_parser("demo", help="short sync-modes + hot-counter (~3-5 min) on the patched server")
    d.add_argument("--bin", help="default: $PGWAL_LAB_PG_BIN, the 18 bench build, or the test default")
    d.add_argument("--results")
    d.add_argument("--allow-stock", action="store_true",
                   help="run on a server that is not pgwal's patched build (refused otherwise)")
    d.set_defaults(fn=cmd_demo)
    rp = sub.add_parser("report", help="render a report from stored runs")
    rp.add_argument("runs", nargs="+")
    rp.add_argument("--out", help="directory for report.md and the plots (default: the first file's folder)")
    rp.add_argument("--title")
    rp.set_defaults(fn=cmd_report)
    f = sub.add_parser("fsync-test", help="pg_test_fsync through the latency shim")
    f.add_argument("--profile", default="tmpfs")
    f.add_argument("--bin")
    f.add_argument("--dir", default="/dev/shm/pgwal-fsync-test")
    f.add_argument("-v", "--verbose", action="store_true")
    f.set_defaults(fn=cmd_fsync_test)
    pt = sub.add_parser("proxy-test", help="the delay proxy's precision and CPU cost (ping-pong RTTs)")
    pt.add_argument("--delays", default="0.05,1,5,10", help="one-way delays in ms (default 0.05,1,5,10)")
    pt.add_argument("--count", type=int, help="round trips per delay (default min(400, 2000 / delay))")
    pt.add_argument("--spin-us", help="the proxy's polling windows to compare, e.g. 0,20,60 "
                    "(default 60, as in custom link profiles; the lan profile uses 20)")
    pt.add_argument("--rounds", type=int, default=1, help="repeat every (delay, window) this often, interleaved")
    pt.add_argument("--json", action="store_true", help="print every measurement as JSON")
    pt.set_defaults(fn=cmd_proxy_test)
    u = sub.add_parser("up", help="bring a topology up and hold it (for manual experiments)")
    u.add_argument("--bin")
    u.add_argument("--standbys", type=int, default=1)
    u.add_argument("--sync", type=int, default=1, help="how many of the standbys are synchronous")
    u.add_argument("--sync-method", default="FIRST", choices=["FIRST", "ANY"])
    u.add_argument("--cascade", action="store_true", help="add an async standby cascading from s1")
    u.add_argument("--net", default="none")
    u.add_argument("--primary-disk", default="tmpfs")
    u.add_argument("--standby-disk", default="tmpfs")
    u.add_argument("--hold", type=float, default=600)
    u.set_defaults(fn=cmd_up)
    c = sub.add_parser("clean", help="remove leftovers of crashed runs")
    c.add_argument("--force", action="store_true", help="also clusters whose owning process is still alive")
    c.set_defaults(fn=cmd_clean)
    sub.add_parser("build-shim", help="compile the LD_PRELOAD shim and its probe").set_defaults(fn=cmd_build)
    mu = sub.add_parser("mutants", help="build the server with each mutant (lab/mutants/) and run histories "
                                        "until a verdict fails where the unmutated server holds; exit 3 if a "
                                        "mutant survives, 4 if the unmutated server failed a history too")
    mu.add_argument("--only", nargs="+", metavar="NAME", help="these mutants (default: all)")
    mu.add_argument("--budget", type=int, default=10, help="histories per mutant at most (default %(default)s)")
    mu.add_argument("--steps", type=int, default=12, help="steps per history (default %(default)s)")
    mu.add_argument("--rounds", type=int, default=1,
                    help="hunt each mutant this often, each round from its own seeds (seed + k x budget), "
                         "for a median of histories to kill (default %(default)s)")
    mu.add_argument("--seed", type=int, default=1, help="seed of the first history (default %(default)s)")
    mu.add_argument("--results", help="results directory (default lab/results/mutants-TIME)")
    mu.add_argument("--list", action="store_true", help="list the mutants and exit")
    mu.set_defaults(fn=cmd_mutants)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except LabError as e:
        print(f"pgwal-lab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
