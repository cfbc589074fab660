"""The audit's report: per level x fault x node, what was acknowledged and
what survived, next to what the level promises."""
from __future__ import annotations

import statistics

from . import check
from ..scenarios import LEVEL_ORDER

READERS = ("plain", "block", "for_update", "durable", "xact_status")


def _level_key(level: str) -> tuple:
    base = level.split("+")[0]
    return (LEVEL_ORDER.index(base) if base in LEVEL_ORDER else len(LEVEL_ORDER), level)


def _cells(records: list[dict]) -> dict:
    """(fault, level, node) -> the checks of valid cycles; (fault, level) -> void count."""
    cells: dict = {}
    void: dict = {}
    for r in records:
        if r.get("void"):
            void[(r["fault"], r["level"])] = void.get((r["fault"], r["level"]), 0) + 1
            continue
        for c in r["checks"]:
            cells.setdefault((r["fault"], r["level"], c["node"]), []).append((r, c))
    return {"cells": cells, "void": void}


def verdict(level: str, fault: str, lost: int, cycles: int, violations: int, window_reads: int = 0) -> str:
    if violations:
        return "**VIOLATION**"
    if check.window_expected(level, fault):
        if window_reads:
            return "ok (0 promised); window seen"
        return "window **not seen: the chosen moment missed it**" if cycles >= 5 else "window not seen yet"
    if check.acks_promised(level, fault):
        return "ok (0 promised)"
    if check.is_control(level, fault):
        if lost:
            return "control: losses seen"
        return "control: **no loss seen: the audit is blind here**" if cycles >= 20 else "control: no loss seen yet"
    return "not promised: losses seen" if lost else "not promised: none seen"


def summary_table(records: list[dict]) -> list[str]:
    cells = _cells(records)["cells"]
    faults = [f for f in check.FAULTS if any(k[0] == f for k in cells)]
    levels = sorted({k[1] for k in cells}, key=_level_key)
    lines = ["Acknowledged commits lost / acknowledged, over all valid cycles, on the node the fault "
             "left serving (kill, power: the restarted primary; failover: the promoted standby). "
             "**0** where the level promises survival; a control (no promise) should show losses.", "",
             "| level | " + " | ".join(faults) + " |", "|---|" + "---|" * len(faults)]
    for lvl in levels:
        row = [f"`{lvl}`"]
        for f in faults:
            node = "promoted" if check.base_fault(f).startswith("failover") else "primary"
            items = cells.get((f, lvl, node), [])
            if not items:
                row.append("–")
                continue
            lost = sum(c["acked_lost"] for _, c in items)
            acked = sum(c["acked"] for _, c in items)
            bad = sum(1 for _, c in items if c["violations"])
            mark = "✗" if bad else ("✓" if check.acks_promised(lvl, f) else
                                    "ctl" if check.is_control(lvl, f) else "np")
            row.append(f"{lost} / {acked} ({len(items)} cycles) {mark}")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "✓ promised and held; ✗ a promise broken (see below); ctl: a control, which must show losses "
              "(else the audit cannot see them); np: not promised, losses possible.", ""]
    return lines


def _ms(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.2f} ({max(values):.2f})"


def detail_tables(records: list[dict]) -> list[str]:
    data = _cells(records)
    cells, void = data["cells"], data["void"]
    lines = []
    for f in check.FAULTS:
        keys = sorted([k for k in cells if k[0] == f], key=lambda k: (_level_key(k[1]), k[2] != "promoted"))
        if not keys:
            continue
        lines += [f"### {f}", "", check.FAULT_DOC[f] + ".", "",
                  "| level | node | cycles (void) | acked | acked lost (cycles) | torn | in doubt (committed) "
                  "| status lied | reads that saw a lost commit: " + ", ".join(READERS)
                  + " | farthest such read: commits, ms before the fault | recovery s median (max) "
                  "| rows differing from the serving node | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, lvl, node in keys:
            items = cells[(f, lvl, node)]
            cks = [c for _, c in items]
            lost = sum(c["acked_lost"] for c in cks)
            lost_cycles = sum(1 for c in cks if c["acked_lost"])
            viol = sum(1 for c in cks if c["violations"])
            reads = []
            for kind in READERS:
                made = sum(c["reads"].get(kind, 0) for c in cks)
                saw = sum(c["reads_lost"].get(kind, 0) for c in cks)
                reads.append("–" if not made else f"{saw}/{made}")
            window_reads = sum(c["reads_lost"].get(k, 0) for c in cks for k in check.WINDOW_READERS)
            far = max((c["reads_lost_commits"] for c in cks), default=0)
            far_ms = [c["reads_lost_ms"] for c in cks if c["reads_lost_ms"] is not None]
            rec_s = [r["recovery_s"] for r, _ in items]
            lines.append(
                f"| `{lvl}` | {node} | {len(cks)} ({void.get((f, lvl), 0)}) | {sum(c['acked'] for c in cks)} | "
                f"{lost} ({lost_cycles}) | {sum(c['torn'] for c in cks)} | "
                f"{sum(c['in_doubt'] for c in cks)} ({sum(c['in_doubt_committed'] for c in cks)}) | "
                f"{sum(c['status_lied'] for c in cks)} | {' · '.join(reads)} | "
                f"{far if far else '–'}{', ' + format(min(far_ms), '.0f') + ' ms' if far_ms else ''} | "
                f"{_ms(rec_s) if node not in ('rejoined', 'standby') else '–'} | "
                f"{sum(c['diverged'] or 0 for c in cks) if cks[0].get('diverged') is not None else '–'} | "
                f"{verdict(lvl, f, lost, len(cks), viol, window_reads)} |")
        lines.append("")
        bad = [(r, c) for k in keys for r, c in cells[k] if c["violations"]]
        for r, c in bad[:20]:
            lines.append(f"- cycle {r['cycle']} `{r['level']}` {c['node']}: " + "; ".join(c["violations"]))
        if bad:
            lines.append("")
    return lines


def section(records: list[dict]) -> list[str]:
    first = records[0]
    proof = first.get("proof") or {}
    params = first.get("params") or {}
    nodes = "; ".join(f"{k}: {v}" for k, v in proof.items() if k != "build")
    per_cell: dict = {}
    for r in records:
        per_cell[(r["fault"], r["level"])] = per_cell.get((r["fault"], r["level"]), 0) + 1
    done = f"{min(per_cell.values())}–{max(per_cell.values())}" if per_cell else "0"
    seeds = sorted({str((r.get("params") or {}).get("seed")) for r in records})
    lines = [f"Server {first.get('server_version')}; {len(records)} cycles, {done} per level and fault (planned "
             f"{params.get('cycles')} per run); load {params.get('load_s')} s before each fault (uniform); "
             f"seed(s) {', '.join(seeds)}. Proved before the first cycle: {nodes or 'nothing'}.", ""]
    lines += summary_table(records)
    lines += detail_tables(records)
    lines += ["Reads: *plain* autocommit, *block* REPEATABLE READ transaction, *for_update* "
              "`SELECT ... FOR UPDATE` of the hot row, *durable* with `durable_snapshots = on`, *xact_status* "
              "`pg_xact_status()` of a commit in flight answered `committed`; a read saw a lost commit when it "
              "returned a writer's sequence number (or the hot row's value) beyond what the recovered node "
              "holds. *in doubt*: the commit in flight at the fault (not acknowledged), and how many of those "
              "the recovered node reports committed; *status lied*: its pg_xact_status disagrees with its "
              "rows. Void cycles (a session failed before the fault) are not counted.", ""]
    return lines


def consumer_section(records: list[dict]) -> list[str]:
    """audit-consumer: per mode, what the copy holds against the source."""
    from ..scenarios.audit_consumer import FAULT_KINDS

    first = records[0]
    params = first.get("params") or {}
    seeds = sorted({str((r.get("params") or {}).get("seed")) for r in records})
    lines = [f"Server {first.get('server_version')}; consumer `{first.get('pgwal')} stream --acks stdin`; "
             f"{len(records)} cycles; load {params.get('load_s')} s with {params.get('faults_per_cycle')} faults "
             f"per cycle at random moments; seed(s) {', '.join(seeds)}.", "",
             "| mode | cycles (void) | faults: " + ", ".join(FAULT_KINDS) + " | commits acknowledged to the "
             "writers | of those never applied | rows on the source | missing from the copy | only in the copy "
             "| applied twice "
             "(transactions, rows) | hot row differs | delivered again and skipped | consumer starts | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in sorted({r["mode"] for r in records}):
        rs = [r for r in records if r["mode"] == mode and not r.get("void")]
        void = sum(1 for r in records if r["mode"] == mode and r.get("void"))
        counts = [sum(f == k for r in rs for f in r["faults"]) for k in FAULT_KINDS]
        c = [r["compare"] for r in rs]
        missing = sum(x["missing"] for x in c)
        lost = sum(x["acked_not_applied"] for x in c)
        bad = sum(1 for r in rs if r["violations"])
        if mode == "exact":
            verdict = "**VIOLATION**" if bad else "exactly once"
        else:
            verdict = "control: losses seen" if lost else "control: **no loss seen: the audit is blind**"
        lines.append(
            f"| `{mode}` | {len(rs)} ({void}) | {' · '.join(map(str, counts))} | "
            f"{sum(r['acked_total'] for r in rs)} | {lost} | "
            f"{sum(x['rows'] for x in c)} | {missing} | {sum(x['extra'] for x in c)} | "
            f"{sum(x['applied_twice'] for x in c)}, {sum(x['duplicate_rows'] for x in c)} | "
            f"{sum(1 for x in c if x['hot_source'] != x['hot_copy'])} | "
            f"{sum(r['redelivered_skipped'] for r in rs)} | {sum(r['consumer_starts'] for r in rs)} | {verdict} |")
    lines.append("")
    for r in [r for r in records if r["violations"]][:20]:
        lines.append(f"- cycle {r['cycle']} `{r['mode']}`: " + "; ".join(r["violations"]))
    lines += ["", "*walsender*: pg_terminate_backend of the slot's walsender (pgwal reconnects); *consumer-kill*: "
              "SIGKILL of the consumer and its pgwal; *pgwal-kill*: SIGKILL of pgwal alone; *crash-at*: the "
              "consumer exits at its Nth transaction between apply and acknowledgement (`exact`: applied, not "
              "acknowledged; `ack-before-apply`: acknowledged and confirmed by the slot, not applied). "
              "*delivered again and skipped*: transactions pgwal delivered after a restart that the copy "
              "already had (end_lsn not beyond its progress).", ""]
    return lines


def receiver_section(records: list[dict]) -> list[str]:
    """audit-receiver: per mode and fault, acknowledged commits missing from
    the receiver's files after its crash."""
    from ..scenarios.audit_receiver import FAULTS, LEVEL, is_control, promised

    first = records[0]
    params = first.get("params") or {}
    seeds = sorted({str((r.get("params") or {}).get("seed")) for r in records})
    lines = [f"Server {first.get('server_version')}; `{first.get('pgwal')} receive --ack MODE` as the only "
             f"synchronous standby, its directory under a volatile page cache; {len(records)} cycles; load "
             f"{params.get('load_s')} s before the crash; seed(s) {', '.join(seeds)}.", "",
             "| `--ack` | level | fault | cycles (void) | commits acknowledged before the crash | of those without "
             "a commit record in the receiver's files (cycles) | verdict |", "|---|---|---|---|---|---|---|"]
    for mode in sorted({r["mode"] for r in records}, key=lambda m: ("flush", "write", "receive").index(m)):
        for fault in FAULTS:
            rs = [r for r in records if r["mode"] == mode and r["fault"] == fault]
            if not rs:
                continue
            ok = [r for r in rs if not r.get("void")]
            lost = sum(r["acked_lost"] for r in ok)
            if any(r["violations"] for r in ok):
                verdict = "**VIOLATION**"
            elif promised(mode, fault):
                verdict = "ok (0 promised)"
            elif is_control(mode, fault):
                verdict = "control: losses seen" if lost else "control: **no loss seen: the audit is blind**"
            else:
                verdict = "not promised: losses seen" if lost else "not promised: none seen"
            lines.append(f"| `{mode}` | `{LEVEL[mode]}` | {fault} | {len(ok)} ({len(rs) - len(ok)}) | "
                         f"{sum(r['acked_before_fault'] for r in ok)} | {lost} "
                         f"({sum(1 for r in ok if r['acked_lost'])}) | {verdict} |")
    lines.append("")
    for r in [r for r in records if r["violations"]][:20]:
        lines.append(f"- cycle {r['cycle']} {r['fault']} `--ack {r['mode']}`: " + "; ".join(r["violations"]))
    lines += ["", "A commit counts as acknowledged when COMMIT returned to its writer before the crash; it is "
              "present when pg_waldump finds its commit record (COMMIT PREPARED by the prepared xid) in the "
              "receiver's files read from the cycle's first segment, right after the crash and before the "
              "receiver starts again.", ""]
    return lines
