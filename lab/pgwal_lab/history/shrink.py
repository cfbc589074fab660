"""Cutting a failing schedule down to a minimal one (delta debugging,
Zeller's ddmin, over the steps).

A candidate keeps the failure if its replay fails with the same kind
(verdict.Failure.kind: safety, liveness, diverged, ...).  Steps that no
longer apply in a candidate are skipped by the replay (schedule.applicable),
so any subset is a valid candidate.  A replay builds a fresh cluster, so
each costs tens of seconds: `budget` bounds the replays, and the smallest
failing schedule found within it is returned.  Failures that depend on
timing may not reproduce every time; a candidate is tried once, so the
result is minimal among what was seen, not proven minimal.
"""
from __future__ import annotations


def shrink(steps: list, kind: str, replay, budget: int = 40, log=print) -> tuple[list, int]:
    """Returns (smallest failing schedule found, replays made).  `replay(steps)`
    returns a history record (its "failure" None or {"kind": ...})."""
    tries = 0
    seen: dict[tuple, bool] = {}

    def fails(cand: list) -> bool:
        nonlocal tries
        key = tuple(str(s) for s in cand)
        if key in seen:
            return seen[key]
        tries += 1
        h = replay(cand)
        # the failure must come from a step that ran: trailing skipped steps are dropped
        ok = bool(h["failure"]) and h["failure"]["kind"] == kind
        seen[key] = ok
        log(f"shrink: {len(cand)} steps -> {'fails' if ok else 'passes'} ({tries}/{budget})")
        return ok

    cur = list(steps)
    n = 2
    while len(cur) >= 2 and tries < budget:
        chunk = max(1, len(cur) // n)
        parts = [cur[i:i + chunk] for i in range(0, len(cur), chunk)]
        reduced = False
        for i in range(len(parts)):
            if tries >= budget:
                break
            complement = [s for j, p in enumerate(parts) if j != i for s in p]
            if complement and fails(complement):
                cur, n, reduced = complement, max(n - 1, 2), True
                break
        if not reduced:
            for p in parts:
                if tries >= budget:
                    break
                if len(p) < len(cur) and fails(p):
                    cur, n, reduced = p, 2, True
                    break
        if not reduced:
            if n >= len(cur):
                break
            n = min(len(cur), n * 2)
    return cur, tries
