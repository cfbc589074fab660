"""The histories section of a report: how many histories and steps ran,
per level and per step kind, what failed, and each failure's minimal
schedule with the command that replays it."""
from __future__ import annotations

from collections import Counter

from .schedule import FAULTS, KINDS, Step


def section(records: list[dict]) -> list[str]:
    steps = [Step.parse(t) for r in records for t in r.get("steps", [])]
    failed = [r for r in records if r.get("failure")]
    faults = [sum(Step.parse(t).kind in FAULTS for t in r.get("steps", [])) for r in records]
    head = (f"{len(records)} histories, {len(steps)} steps "
            f"({min((len(r['steps']) for r in records), default=0)}–"
            f"{max((len(r['steps']) for r in records), default=0)} per history; faults "
            f"{min(faults, default=0)}–{max(faults, default=0)} per history, {sum(faults)} in all), "
            f"{sum(r.get('seconds', 0) for r in records) / 60:.1f} min; ")
    lines = [head + (f"**{len(failed)} failed**." if failed else "every verdict held."), ""]
    kinds, levels = Counter(s.kind for s in steps), Counter(s.level for s in steps)
    lines += ["| step kind | steps | what it does |", "|---|---|---|"]
    lines += [f"| {k} | {kinds.get(k, 0)} | {doc} |" for k, (_, doc) in KINDS.items()]
    lines += ["", "| level | steps |", "|---|---|"]
    lines += [f"| {lvl} | {n} |" for lvl, n in sorted(levels.items())]
    labels = Counter(rec.get("label") for r in records for rec in r.get("records", []) if rec.get("label"))
    lines += [""] + coverage(records)
    lines += ["", "Promises tested (a step's fault label: which acknowledgements it may not take): "
              + ", ".join(f"{k} {v}" for k, v in sorted(labels.items())), ""]
    # the controls: losses where the step's label allowed them show that the
    # ledger sees a lost commit when there is one
    from ..audit.check import acks_promised

    ctl = [(rec, Step.parse(rec["text"]).level) for r in records for rec in r.get("records", [])
           if rec.get("label") and "acked_lost" in rec]
    allowed = [(rec, lvl) for rec, lvl in ctl if not acks_promised(lvl, rec["label"])]
    lost = sum(rec["acked_lost"] for rec, _ in allowed)
    lines += [f"Controls: {len(allowed)} steps whose level did not promise their acknowledgements across their "
              f"fault lost {lost} acknowledged commits in {sum(1 for rec, _ in allowed if rec['acked_lost'])} "
              f"of them; steps whose level promised it lost none (or the history failed).", ""]
    lines += readers(records)
    for r in failed:
        f = r["failure"]
        lines += [f"### History {r.get('seed', 'replay')}: failed at step {f['step']} ({f['kind']})", "",
                  f"- step: `{r['steps'][f['step'] - 1]}`", f"- verdict: {f['message'][:500]}",
                  f"- schedule: `{' '.join(r['steps'])}`"]
        if r.get("shrunk"):
            lines += [f"- minimal schedule ({len(r['shrunk']['steps'])} steps, {r['shrunk']['replays']} "
                      f"replays): `{' '.join(r['shrunk']['steps'])}`",
                      f"- replay: `{r['shrunk']['replay']}`"]
        if f.get("logs"):
            lines.append(f"- node logs: {f['logs']}")
        lines.append("")
    return lines


def readers(records: list[dict]) -> list[str]:
    """Reads per reader kind, and those that saw a commit the step's fault
    then took (where the label allowed it; a promised one fails the
    history).  Records made before steps counted reads per kind are left
    out."""
    reads: Counter = Counter()
    lost: Counter = Counter()
    for r in records:
        for rec in r.get("records", []):
            reads.update(rec.get("reads") or {})
            lost.update(rec.get("reads_lost_by") or {})
    if not reads:
        return []
    return ["| reader | reads | saw a commit then lost |", "|---|---|---|"] + \
        [f"| {k} | {n} | {lost.get(k, 0)} |" for k, n in sorted(reads.items())] + [""]


# fault labels of records made before steps recorded their target's role
_ROLE_BY_LABEL = {"kill": "primary", "power": "primary", "held-power": "primary", "failover": "sync",
                  "failover-async": "not sync", "standby-power": "standby"}


def coverage(records: list[dict]) -> list[str]:
    """The matrix of what ran: steps by fault kind, the role of the node it
    hit, the features in effect there, and level; a cell whose step failed
    its history is marked ✗.  Steps that hit no node are left out."""
    cells: Counter = Counter()
    failed: set = set()
    for r in records:
        fail_at = (r.get("failure") or {}).get("step")
        for rec in r.get("records", []):
            step = Step.parse(rec["text"])
            if not step.args or step.kind in ("uw", "summarize"):  # its argument is a setting, not a node
                continue
            role = rec.get("role") or _ROLE_BY_LABEL.get(rec.get("label"), "?")
            key = (step.kind, role, rec.get("features", "?"), step.level)
            cells[key] += 1
            if fail_at == rec.get("step"):
                failed.add(key)
    if not cells:
        return []
    levels = sorted({k[3] for k in cells}, key=_level_order)
    rows = sorted({k[:3] for k in cells})
    out = ["Coverage: steps by fault, the role of the node it hit when it began (`sync`: the standby the "
           "primary's synchronous commits waited for; `potential`: another direct standby; `cascade`: "
           "behind a standby), the features in effect there (`uw`: the primary streams unflushed WAL; "
           "`accepts`: the standby takes it; `fw`: its flush worker is on; `?`: not recorded) and level. "
           "✗ marks a cell with a failed step.", "",
           "| fault | role | features | " + " | ".join(levels) + " | all |",
           "|---|---|---|" + "---|" * (len(levels) + 1)]
    for row in rows:
        counts = [cells.get(row + (lvl,), 0) for lvl in levels]
        marks = [f"{n}{' ✗' if row + (lvl,) in failed else ''}" if n else "" for n, lvl in zip(counts, levels)]
        out.append(f"| {row[0]} | {row[1]} | {row[2]} | " + " | ".join(marks) + f" | {sum(counts)} |")
    return out


def _level_order(level: str) -> tuple:
    from ..scenarios import LEVEL_ORDER

    base = level.split("+")[0]
    return (LEVEL_ORDER.index(base) if base in LEVEL_ORDER else len(LEVEL_ORDER), level)
