"""Reports: markdown tables and PNG plots (matplotlib) from stored runs.

For every scenario and group: per variant n, TPS median / mean / spread with
a bootstrap 95% CI of the median, latency p50/p99 (medians over runs), WAL
per transaction, replication lags and walsender/walreceiver CPU; then each
variant compared with the group's first variant (ratio of median TPS, its
bootstrap 95% CI, Mann-Whitney p, verdict).  wal-volume gets its own
tables: WAL bytes per level and the top record types with FPI share.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import stats  # noqa: E402


def _fmt(v, nd=1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def _vals(recs, key):
    return [r["metrics"].get(key) for r in recs if r["metrics"].get(key) is not None]


def _med(recs, key):
    v = _vals(recs, key)
    return float(np.median(v)) if v else None


def group_records(records):
    out: dict = {}
    for r in records:
        out.setdefault(r["scenario"], {}).setdefault(r["group"], {}).setdefault(r["variant"], []).append(r)
    return out


def machine_section(records) -> list[str]:
    r = records[0]
    m = r.get("machine", {})
    lines = ["## Machine and versions", ""]
    for k in ("os", "kernel", "cpu", "cpus", "mem_gib", "python", "repo_commit"):
        lines.append(f"- {k}: {m.get(k)}")
    lines.append(f"- server: {r.get('server_version')}")
    lines.append(f"- bin dir: {r.get('bin_dir')}")
    lines.append(f"- load average at start: {m.get('loadavg')}")
    lines.append(f"- network namespaces: {r.get('namespaces')}")
    meth = r.get("method", {})
    lines.append(f"- method: {meth}")
    lines.append("")
    return lines


def tps_plot(scenario: str, groups: dict, out: Path) -> Path:
    n = len(groups)
    fig, axes = plt.subplots(n, 2, figsize=(11, 2.8 * n + 0.6), squeeze=False)
    for i, (g, variants) in enumerate(groups.items()):
        names = list(variants)
        med = []
        err = [[], []]
        for v in names:
            t = _vals(variants[v], "tps")
            m = float(np.median(t)) if t else 0.0
            lo, hi = stats.bootstrap_median_ci(t) if t else (0.0, 0.0)
            med.append(m)
            err[0].append(max(0.0, m - lo))
            err[1].append(max(0.0, hi - m))
        ax = axes[i][0]
        ax.bar(names, med, yerr=err, capsize=4, color="#4878a8")
        ax.set_title(f"{g}: TPS (median, 95% CI)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        ax = axes[i][1]
        x = np.arange(len(names))
        p50 = [_med(variants[v], "lat_p50_ms") or 0 for v in names]
        p99 = [_med(variants[v], "lat_p99_ms") or 0 for v in names]
        ax.bar(x - 0.2, p50, 0.4, label="p50")
        ax.bar(x + 0.2, p99, 0.4, label="p99")
        ax.set_xticks(x, names, fontsize=8, rotation=20)
        ax.set_title(f"{g}: latency ms (median of runs)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{scenario}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def wal_plot(variants: dict, out: Path) -> Path:
    names = list(variants)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
    for j, (key, title) in enumerate((("init_wal_bytes", "pgbench -i WAL (MB)"), ("oltp_wal_bytes", "OLTP WAL (MB)"))):
        vals = [(_med(variants[v], key) or 0) / 1e6 for v in names]
        fpi = [(_med(variants[v], key.replace("wal_bytes", "fpi_bytes")) or 0) / 1e6 for v in names]
        ax[j].bar(names, vals, label="total", color="#4878a8")
        ax[j].bar(names, fpi, label="of which full-page images", color="#d08040")
        ax[j].set_title(title, fontsize=9)
        ax[j].legend(fontsize=7)
    fig.tight_layout()
    path = out / "wal-volume.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def wal_section(variants: dict, out: Path) -> list[str]:
    lines = ["| wal_level | n | init WAL bytes | init FPI bytes | OLTP WAL bytes | OLTP FPI bytes | OLTP WAL/txn |",
             "|---|---|---|---|---|---|---|"]
    for v, recs in variants.items():
        lines.append(f"| {v} | {len(recs)} | {_fmt(_med(recs, 'init_wal_bytes'))} | "
                     f"{_fmt(_med(recs, 'init_fpi_bytes'))} | {_fmt(_med(recs, 'oltp_wal_bytes'))} | "
                     f"{_fmt(_med(recs, 'oltp_fpi_bytes'))} | {_fmt(_med(recs, 'oltp_wal_bytes_per_txn'))} |")
    lines.append("")
    for phase in ("init", "oltp"):
        lines += [f"Top record types, {phase} phase (last run of each level; bytes incl. FPI):", "",
                  "| wal_level | record type | count | record bytes | FPI bytes |", "|---|---|---|---|---|"]
        for v, recs in variants.items():
            wd = recs[-1]["metrics"].get(f"{phase}_waldump") or {}
            top = sorted((wd.get("types") or {}).items(), key=lambda kv: -kv[1]["combined"])[:6]
            for name, t in top:
                lines.append(f"| {v} | {name} | {t['n']:,} | {t['record']:,} | {t['fpi']:,} |")
        lines.append("")
    lines.append(f"![wal-volume]({wal_plot(variants, out).name})")
    lines.append("")
    return lines


def render(records: list[dict], out: Path, title: str | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title or 'pgwal lab report'}", ""]
    if not records:
        lines.append("No runs stored.")
    else:
        lines += machine_section(records)
    for scenario, groups in group_records(records).items():
        lines += [f"## {scenario}", ""]
        if scenario == "wal-volume":
            for g, variants in groups.items():
                lines += wal_section(variants, out)
            continue
        for g, variants in groups.items():
            lines += [f"### {g}", "",
                      "| variant | n | TPS median | TPS mean | spread % | TPS 95% CI | lat p50 ms | lat p99 ms "
                      "| WAL B/txn | flush lag ms | replay lag ms | walsender CPU % | walreceiver CPU % "
                      "| walsender WAL reads | replies/s |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for v, recs in variants.items():
                s = stats.summary(_vals(recs, "tps"))
                lo, hi = stats.bootstrap_median_ci(_vals(recs, "tps")) if s["n"] else (None, None)
                lines.append(
                    f"| {v} | {s['n']} | {_fmt(s['median'])} | {_fmt(s['mean'])} | {_fmt(s['spread_pct'])} | "
                    f"{_fmt(lo)}–{_fmt(hi)} | {_fmt(_med(recs, 'lat_p50_ms'), 2)} | "
                    f"{_fmt(_med(recs, 'lat_p99_ms'), 2)} | {_fmt(_med(recs, 'wal_bytes_per_txn'), 0)} | "
                    f"{_fmt(_med(recs, 'flush_lag_ms_mean'), 2)} | {_fmt(_med(recs, 'replay_lag_ms_mean'), 2)} | "
                    f"{_fmt(_med(recs, 'walsender_cpu_pct'))} | {_fmt(_med(recs, 'walreceiver_cpu_pct'))} | "
                    f"{_fmt(_med(recs, 'walsender_wal_reads'), 0)} | {_fmt(_med(recs, 'reply_chunks_per_s'), 0)} |")
            names = list(variants)
            if len(names) > 1:
                base = names[0]
                lines += ["", f"Compared with `{base}` (ratio of median TPS, bootstrap 95% CI, Mann-Whitney U):", "",
                          "| variant | ratio | 95% CI | p | verdict |", "|---|---|---|---|---|"]
                a = _vals(variants[base], "tps")
                for v in names[1:]:
                    c = stats.compare(a, _vals(variants[v], "tps"), name_a=base, name_b=v)
                    lines.append(f"| {v} | {_fmt(c['ratio'], 3)} | {_fmt(c['ci_low'], 3)}–{_fmt(c['ci_high'], 3)} "
                                 f"| {_fmt(c['p'], 3)} | {c['verdict']} |")
            lines.append("")
        lines += [f"![{scenario}]({tps_plot(scenario, groups, out).name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
