"""Mutation testing of the history explorer: does it fail a broken server?

A mutant (lab/mutants/NAME.diff) is a small change to the series' final
tree that breaks one promise silently: the server starts, replicates and
answers, and only the data tells.  For each mutant the server is built with
it (a worktree of the build tree, .build/mutant/pg, built like the check
flavour into .build/mutant/install/check), and histories are drawn from
consecutive seeds until a verdict fails (the mutant is killed) or the
budget is spent (it survives).  A surviving mutant is a finding about the
explorer, not about the server: the explorer must be made to see it.

The mutant proves itself before any history runs: the tree must differ from
the series by exactly the mutant's diff, and the object file of every
source file it touches must have been rebuilt after the diff was applied.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .util import LAB_DIR, REPO, LabError, chown_to_pg, run

MUTANTS_DIR = LAB_DIR / "mutants"
BUILD = REPO / ".build" / "mutant"


@dataclass
class Mutant:
    name: str
    path: Path
    breaks: str     # the header's first line
    catches: str    # which verdict should fail

    @property
    def files(self) -> list[str]:
        return [ln.split(" b/", 1)[1] for ln in self.path.read_text().splitlines()
                if ln.startswith("diff --git ")]


def load(names: list[str] | None = None) -> list[Mutant]:
    out = []
    for p in sorted(MUTANTS_DIR.glob("*.diff")):
        lines = p.read_text().splitlines()
        breaks = lines[0].split(": ", 1)[1].rstrip(".") if lines and ": " in lines[0] else ""
        catches = next((ln.split(": ", 1)[1].rstrip(".") for ln in lines if ln.startswith("A verdict should fail")),
                       "")
        out.append(Mutant(p.stem, p, breaks, catches))
    if names:
        unknown = set(names) - {m.name for m in out}
        if unknown:
            raise LabError(f"no such mutant: {', '.join(sorted(unknown))} (see {MUTANTS_DIR})")
        out = [m for m in out if m.name in names]
    return out


def _git(tree: Path, *args) -> str:
    r = run(["git", "-c", "safe.directory=*", "-C", tree, *args], as_pg=True, check=False, timeout=600)
    if r.returncode != 0:
        raise LabError(f"git {' '.join(map(str, args))} in {tree}: {r.stderr.strip()[-500:]}")
    return r.stdout


def prepare_tree(m: Mutant) -> Path:
    """The series' final tree with the mutant applied, in a worktree of the
    build tree (.build/pg, branch pgwal)."""
    main = REPO / ".build" / "pg"
    if not (main / ".git").is_dir():
        raise LabError("no build tree .build/pg: run server/pg build first")
    tree = BUILD / "pg"
    BUILD.mkdir(parents=True, exist_ok=True)
    chown_to_pg(BUILD)  # the server user builds in it
    if not (tree / ".git").exists():
        _git(main, "worktree", "prune")
        _git(main, "worktree", "add", "-q", "-f", "--detach", tree, "pgwal")
    _git(tree, "checkout", "-q", "-f", "--detach", "pgwal")
    _git(tree, "clean", "-q", "-fdx")
    r = run(["git", "-c", "safe.directory=*", "-C", tree, "apply", m.path], as_pg=True, check=False,
            timeout=120)
    if r.returncode != 0:
        raise LabError(f"mutant {m.name} does not apply to the series any more: {r.stderr.strip()[-300:]}")
    changed = sorted(_git(tree, "diff", "--name-only").split())
    if changed != sorted(m.files):
        raise LabError(f"mutant {m.name}: the tree differs in {changed}, the diff names {m.files}")
    # the server tool reads the source cache from the build directory it is given
    cache = BUILD / "cache"
    if not cache.exists():
        cache.symlink_to(REPO / ".build" / "cache")
    return tree


def build(m: Mutant, log=print) -> Path:
    """Build the mutant like the check flavour; returns its bin directory."""
    tree = prepare_tree(m)
    applied = time.time()
    log(f"mutants: building {m.name} ({', '.join(m.files)})")
    env = dict(os.environ, PGWAL_BUILD_DIR=str(BUILD))
    r = subprocess.run([str(REPO / "server" / "pg"), "build", "--flavour", "check"], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"mutant {m.name} does not build: {r.stderr.strip()[-800:]}")
    obj = BUILD / "obj-check"
    for f in m.files:
        if not f.endswith(".c"):
            continue
        o = obj / (f[:-2] + ".o")
        if not o.exists() or o.stat().st_mtime < applied:
            raise LabError(f"mutant {m.name}: {o} was not rebuilt after the mutant was applied: "
                           f"the build would not be the mutant")
    return BUILD / "install" / "check" / "bin"


def hunt(m: Mutant, bin_dir: Path, budget: int, steps: int, seed: int, logs_dir: Path | None,
         log=print, baseline_bin: Path | None = None) -> dict:
    """Histories from consecutive seeds until one fails (killed) or `budget`
    ran, their draws weighted toward the cells the hunt has not covered yet
    (as a run of histories does).  A history that fails as a defect of the
    explorer (kind `lab`) does not kill; it is counted.

    With `baseline_bin` (the unmutated build), a failure kills only if the
    same schedule, replayed up to the failed step on the unmutated server,
    holds: a failure the unmutated server shares is a finding about the
    server (or the verdict), not about the mutant.  It is recorded under
    `baseline_failures` and the hunt goes on."""
    from collections import Counter

    from .history import schedule as sched
    from .scenarios import histories

    d = histories.DEFAULTS
    res: dict = {"mutant": m.name, "breaks": m.breaks, "killed": False, "histories": 0, "lab_defects": 0,
                 "seeds": []}
    covered: Counter = Counter()
    t0 = time.monotonic()
    for i in range(budget):
        h = histories.run_history(bin_dir, seed + i, steps, None, d["levels"], d["net"], d["wal_fsync_ms"],
                                  logs_dir, log=log, covered=covered, choices=d["choices"])
        res["histories"] += 1
        res["seeds"].append(seed + i)
        f = h["failure"]
        if f and f["kind"] == "lab":
            res["lab_defects"] += 1
            continue
        if f:
            failed = h["steps"][:f["step"]]
            if baseline_bin is not None:
                log(f"mutants: history {seed + i} failed ({f['kind']}); replaying its {len(failed)} steps on "
                    f"the unmutated server")
                b = histories.run_history(baseline_bin, None, 0, [sched.Step.parse(t) for t in failed],
                                          d["levels"], d["net"], d["wal_fsync_ms"], logs_dir, log=log)
                bf = b["failure"]
                res["baseline_replays"] = res.get("baseline_replays", 0) + 1
                if bf and bf["kind"] != "lab":
                    log(f"mutants: the unmutated server fails it too ({bf['message'][:200]}): not a kill")
                    res.setdefault("baseline_failures", []).append(
                        {"seed": seed + i, "step": f["step"], "schedule": failed, "kind": bf["kind"],
                         "message": bf["message"][:400], "mutant_message": f["message"][:400]})
                    continue
            res.update(killed=True, kind=f["kind"], message=f["message"][:400], seed=seed + i,
                       step=f["step"], schedule=failed)
            break
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res



def histories_to_kill(rounds: list[dict]) -> float | None:
    """The median of a mutant's histories-to-kill over its rounds, a round
    that survived counting as more than any kill (None when that is the
    median: the mutant survives in at least half of its rounds)."""
    n = sorted(r["histories"] if r["killed"] else float("inf") for r in rounds)
    if not n:
        return None
    mid = len(n) // 2
    med = n[mid] if len(n) % 2 else (n[mid - 1] + n[mid]) / 2
    return None if med == float("inf") else med


def report(results: list[dict]) -> str:
    """A Markdown table: kill rate and histories to kill per mutant (one
    row per mutant; with several rounds, each round's count and the
    median)."""
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["mutant"], []).append(r)
    killed = [name for name, rs in by.items() if all(r["killed"] for r in rs)]
    rounds = max(len(rs) for rs in by.values()) if by else 0
    lines = [f"{len(killed)} of {len(by)} mutants killed" + (f" in every one of their {rounds} rounds."
                                                            if rounds > 1 else "."), ""]
    shared = [(r["mutant"], b) for r in results for b in r.get("baseline_failures", [])]
    if shared:
        lines += [f"{len(shared)} failures were shared by the unmutated server (not kills; findings about "
                  "the server or the verdict):", ""]
        lines += [f"- {name}: history {b['seed']} step {b['step']} (`{b['schedule'][-1]}`): {b['message']}"
                  for name, b in shared]
        lines.append("")
    if rounds > 1:
        lines += ["| mutant | breaks | killed in | histories to kill, per round | median | verdicts |",
                  "|---|---|---|---|---|---|"]
        for name, rs in by.items():
            counts = ", ".join(str(r["histories"]) if r["killed"] else f"survived {r['histories']}" for r in rs)
            med = histories_to_kill(rs)
            kinds = ", ".join(sorted({r["kind"] for r in rs if r["killed"]}))
            lines.append(f"| {name} | {rs[0]['breaks']} | {sum(r['killed'] for r in rs)} of {len(rs)} | "
                         f"{counts} | {'**survives**' if med is None else f'{med:g}'} | {kinds} |")
        return "\n".join(lines) + "\n"
    lines += ["| mutant | breaks | killed | histories | verdict | seed, step |", "|---|---|---|---|---|---|"]
    for r in results:
        runs = str(r["histories"])
        if r["lab_defects"]:
            runs += f" ({r['lab_defects']} lab defects)"
        where = f"{r['seed']}, {r['step']}" if r["killed"] else ""
        lines.append(f"| {r['mutant']} | {r['breaks']} | {'yes' if r['killed'] else '**survived**'} | "
                     f"{runs} | {r.get('kind', '')} | {where} |")
    return "\n".join(lines) + "\n"
