"""The histories section of a report: how many histories and steps ran,
per level and per step kind, what failed, and each failure's minimal
schedule with the command that replays it."""
from __future__ import annotations

from collections import Counter

from .schedule import KINDS, Step


def section(records: list[dict]) -> list[str]:
    steps = [Step.parse(t) for r in records for t in r.get("steps", [])]
    failed = [r for r in records if r.get("failure")]
    lines = [f"{len(records)} histories, {len(steps)} steps "
             f"({min((len(r['steps']) for r in records), default=0)}–"
             f"{max((len(r['steps']) for r in records), default=0)} per history), "
             f"{sum(r.get('seconds', 0) for r in records) / 60:.1f} min; "
             f"**{len(failed)} failed**." if failed else
             f"{len(records)} histories, {len(steps)} steps "
             f"({min((len(r['steps']) for r in records), default=0)}–"
             f"{max((len(r['steps']) for r in records), default=0)} per history), "
             f"{sum(r.get('seconds', 0) for r in records) / 60:.1f} min; every verdict held.", ""]
    kinds, levels = Counter(s.kind for s in steps), Counter(s.level for s in steps)
    lines += ["| step kind | steps | what it does |", "|---|---|---|"]
    lines += [f"| {k} | {kinds.get(k, 0)} | {doc} |" for k, (_, doc) in KINDS.items()]
    lines += ["", "| level | steps |", "|---|---|"]
    lines += [f"| {lvl} | {n} |" for lvl, n in sorted(levels.items())]
    labels = Counter(rec.get("label") for r in records for rec in r.get("records", []) if rec.get("label"))
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
