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
import re
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401
import numpy as np  # noqa: E402

from . import model, stats  # noqa: E402
from .replay_delay import HOPS  # noqa: E402
from .proof import summary  # noqa: E402
from .store import cpu_label, is_busy  # noqa: E402


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


def _runs_range(vals) -> str:
    return f"{min(vals):.2f}–{max(vals):.2f}" if vals else "–"


def commit_model_section(variants) -> list[str]:
    """COMMIT latency (pgbench -r) against the latency model (model.py),
    for groups whose workload timed its COMMIT apart."""
    if not any(r["metrics"].get("commit_ms") is not None for recs in variants.values() for r in recs):
        return []
    first = next(iter(variants.values()))[0]
    reply = first.get("params", {}).get("reply_events")
    reply = ", ".join(reply) if isinstance(reply, list) else reply
    inp = model.inputs(first.get("proof"), reply_events=reply)
    if inp is None:
        return ["", "COMMIT latency measured, but the proof lacks a disk probe or a link: no model."]
    # the calibrated model's measured term: `local` in each unflushed mode of the group
    local = {}
    for recs in variants.values():
        meta = recs[0].get("variant_config", {}).get("meta", {})
        if meta.get("level") == "local" and _med(recs, "commit_ms") is not None:
            local[meta.get("unflushed") == "written"] = _med(recs, "commit_ms")
    lines = ["", f"COMMIT latency against the model (docs/design/unflushed-wal.md; inputs from the proof, ms: "
                 f"primary pwrite {inp['w']:.3f}, fdatasync {inp['F_p']:.3f}; RTT {inp['rtt']:.3f}; "
                 f"standby pwrite {inp['W_s']:.3f}, fdatasync {inp['F_s']:.3f}; standby replies after its "
                 f"write: {'yes' if inp['write_reply'] else 'no'}). Measured: the mean of each run's COMMIT "
                 f"(pgbench -r), median over runs. Fits: within ±{model.TOLERANCE:.0%} or "
                 f"±{model.TOLERANCE_MS} ms."]
    if local:
        lines[-1] += (" Calibrated: the model with the primary's own commit work measured by the `local` "
                      "variant of the same unflushed mode (model.py).")
    lines += ["", "| variant | COMMIT ms | runs min–max | model ms | measured − model ms | deviation % | fits |"
              + (" calibrated ms | measured − calibrated ms | fits |" if local else ""),
              "|---|---|---|---|---|---|---|" + ("---|---|---|" if local else "")]
    for v, recs in variants.items():
        meta = recs[0].get("variant_config", {}).get("meta", {})
        got = _med(recs, "commit_ms")
        vals = _vals(recs, "commit_ms")
        unflushed = meta.get("unflushed") == "written"
        try:
            want = model.predict(meta.get("level"), unflushed, inp)
        except ValueError:
            want = None
        calibrated = ""
        if local:
            base = local.get(unflushed, local.get(False))
            if meta.get("level") == "local":
                calibrated = " (calibration) | – | – |"
            elif got is None or want is None or base is None:
                calibrated = " – | – | – |"
            else:
                cal = model.predict_calibrated(meta.get("level"), unflushed, inp, base)
                calibrated = f" {cal:.2f} | {got - cal:+.2f} | {'yes' if model.fits(got, cal) else '**no**'} |"
        if got is None or want is None:
            lines.append(f"| {v} | {_fmt(got, 2)} | {_runs_range(vals)} | – | – | – | – |" + calibrated)
            continue
        lines.append(f"| {v} | {got:.2f} | {_runs_range(vals)} | {want:.2f} | {got - want:+.2f} | "
                     f"{(got / want - 1) * 100:+.1f} | {'yes' if model.fits(got, want) else '**no**'} |"
                     + calibrated)
    return lines


def replay_delay_section(variants) -> list[str]:
    """Primary flush to standby replay, measured from outside (replay_delay.py)."""
    if not any(r["metrics"].get("flush_to_replay_ms_p50") is not None for recs in variants.values() for r in recs):
        return []
    first = next(iter(variants.values()))[0]
    every = first.get("method", {}).get("replay_probe_s") or 0
    lines = ["", f"From the primary's flush to the standby's replay, sampled from outside every "
                 f"{every * 1000:.0f} ms (one origin for every mode, unlike `replay_lag`; medians over runs of "
                 "each run's percentiles):", "",
             "| variant | p50 ms | p90 ms | p99 ms | replay_lag (pg_stat_replication) mean ms | samples/run |",
             "|---|---|---|---|---|---|"]
    for v, recs in variants.items():
        lines.append(f"| {v} | {_fmt(_med(recs, 'flush_to_replay_ms_p50'), 2)} | "
                     f"{_fmt(_med(recs, 'flush_to_replay_ms_p90'), 2)} | "
                     f"{_fmt(_med(recs, 'flush_to_replay_ms_p99'), 2)} | "
                     f"{_fmt(_med(recs, 'replay_lag_ms_mean'), 2)} | "
                     f"{_fmt(_med(recs, 'flush_to_replay_samples'), 0)} |")
    if any(r["metrics"].get("flush_to_flushed_ms_p50") is not None for recs in variants.values() for r in recs):
        hops = [h for h in HOPS if h != "replay"]
        lines += ["", "The same delay to each hop on the standby (p50 / p99 ms; *written*, *flushed*: by its "
                      "walreceiver; *upstream_flush*: it has heard that the primary flushed it (`upstream_flush_lsn`, "
                      "streams with the sender flush position only); *usable*: what the startup process may "
                      "replay, the lesser of *flushed* and *upstream_flush*; *backlog*: usable minus replayed, "
                      "p50 / p90 over samples; *at release*: WAL up to a flush still to replay when it became "
                      "usable, p50 / p90; *replay MB per CPU s*: WAL bytes per second of the startup process's "
                      "CPU; *run-queue wait*: mean µs the startup process / walreceiver waited for a core each "
                      "time it ran, from /proc/<pid>/schedstat):", "",
                  "| variant | " + " | ".join(hops) + " | replay | backlog kB | at release kB | "
                  "replay MB per CPU s | run-queue wait µs |", "|---|" + "---|" * (len(hops) + 5)]
        for v, recs in variants.items():
            cells = [f"{_fmt(_med(recs, f'flush_to_{h}_ms_p50'), 2)} / {_fmt(_med(recs, f'flush_to_{h}_ms_p99'), 2)}"
                     for h in hops + ["replay"]]
            cells.append(f"{_fmt(_med(recs, 'replay_backlog_kb_p50'), 1)} / {_fmt(_med(recs, 'replay_backlog_kb_p90'), 1)}")
            cells.append(f"{_fmt(_med(recs, 'release_backlog_kb_p50'), 1)} / "
                         f"{_fmt(_med(recs, 'release_backlog_kb_p90'), 1)}")
            cells.append(_fmt(_med(recs, "replay_mb_per_cpu_s"), 1))
            cells.append(f"{_fmt(_med(recs, 'startup_runq_wait_us'), 0)} / "
                         f"{_fmt(_med(recs, 'walreceiver_runq_wait_us'), 0)}")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


def build_proofs(recs) -> str:
    """Which postgres each of a variant's runs was shown to execute."""
    seen: dict[str, int] = {}
    for r in recs:
        b = (r.get("proof") or {}).get("build") or {}
        key = f"{'patched' if b.get('patched') else 'stock'} {b.get('server_version')} ({b.get('postgres')})"
        seen[key] = seen.get(key, 0) + 1
    return ", ".join(f"{k} in {n} of {len(recs)} runs" for k, n in seen.items())


def _env_label(recs) -> dict | None:
    """A variant's environment as the report shows it: a build by its name
    (the proof line gives its path)."""
    env = recs[0].get("variant_config", {}).get("env")
    if env and "build" in env:
        env = {**env, "build": _meta(recs).get("build") or env["build"]}
    return env


def _meta(recs) -> dict:
    return recs[0].get("variant_config", {}).get("meta", {})


def group_records(records):
    out: dict = {}
    for r in records:
        out.setdefault(r["scenario"], {}).setdefault(r["group"], {}).setdefault(r["variant"], []).append(r)
    return out


def _natural(text: str) -> list:
    """Sort key that orders "fsync 10 ms" after "fsync 1 ms" and "8 clients" before "32 clients"."""
    return [(0, float(t), "") if t[:1].isdigit() else (1, 0.0, t)
            for t in re.findall(r"\d+(?:\.\d+)?|\D+", text)]


def _host_key(record: dict) -> tuple:
    """What tells machines apart: the kernel build and, where recorded, the CPU id."""
    m = record.get("machine", {})
    return m.get("kernel"), cpu_label(m)


def _hosts(records) -> list[str]:
    """One line per distinct machine among the records, told apart by the
    kernel build string (it changes when the VM moves to another host) and
    the CPU's family and model where recorded, with the range of the
    single-core probe where recorded and the groups run there."""
    seen: dict = {}
    for x in records:
        entry = seen.setdefault(_host_key(x), (set(), []))
        entry[0].add(str(x.get("group")))
        probe = x.get("machine", {}).get("cpu_probe_mb_s")
        if probe:
            entry[1].append(probe)
    out = []
    for (kernel, label), (groups, probes) in seen.items():
        cpu = f" ({label})" if label else ""
        speed = f", probe {min(probes):,.0f}–{max(probes):,.0f} MB/s" if probes else ""
        out.append(f"kernel {kernel}{cpu}{speed}: {'; '.join(sorted(groups, key=_natural))}")
    return out


def machine_section(records) -> list[str]:
    r = records[0]
    m = r.get("machine", {})
    lines = ["## Machine and versions", ""]
    for k in ("os", "kernel", "cpu", "cpus", "mem_gib", "python", "repo_commit"):
        lines.append(f"- {k}: {m.get(k)}")
    if m.get("cpu_family") is not None:
        lines.append(f"- cpu id: {cpu_label(m)} stepping {m.get('cpu_stepping')}, microcode {m.get('cpu_microcode')}")
    probe = m.get("cpu_probe_mb_s")
    lines.append(f"- single-core probe (SHA-256): {f'{probe:,.0f} MB/s' if probe else 'not recorded'}")
    lines.append(f"- server: {r.get('server_version')}")
    lines.append(f"- bin dir: {r.get('bin_dir')}")
    lines.append(f"- load average at start: {m.get('loadavg')}")
    lines.append(f"- network namespaces: {r.get('namespaces')}")
    meth = r.get("method", {})
    lines.append(f"- method: {meth}")
    lines.append("")
    busy = [x for x in records
            if is_busy((x.get("machine", {}).get("loadavg") or [0])[0], x.get("machine", {}).get("cpus"))]
    if busy:
        worst = max(x["machine"]["loadavg"][0] for x in busy)
        lines += [f"**Warning: the machine was busy before the scenario started (1-minute load average up to "
                  f"{worst:.1f} on {m.get('cpus')} cores; {len(busy)} of {len(records)} runs affected). Other work "
                  "competed for the CPUs: treat these numbers as indicative, not as results.**", ""]
    hosts = _hosts(records)
    if len(hosts) > 1:
        lines += ["**These runs were made in " + f"{len({x.get('run_id') for x in records})} invocations on "
                  f"{len(hosts)} different machines. Each group's variants ran "
                  "interleaved in one invocation, so comparisons within a group hold; numbers from "
                  "different groups may differ because the machine did.**", ""]
        lines += [f"- {h}" for h in hosts] + [""]
    if any(x.get("smoke") for x in records):
        lines += ["**Smoke run: seconds-long runs that check the lab works; not a measurement.**", ""]
    return lines


def _log_scale(ax, values: list[float]) -> bool:
    """Log y axis when the bars span more than 20x, so the small ones stay
    readable next to e.g. `off`."""
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 20:
        ax.set_yscale("log", nonpositive="clip")
        # bars start at the power of ten below the smallest, so every bar shows
        ax.set_ylim(bottom=10 ** math.floor(math.log10(min(pos))))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        return True
    return False


def _variant_ticks(ax, x, names: list[str]) -> None:
    """Variant names under the bars; slanted and right-aligned when there are
    many, so long names such as `remote_write+fw` do not overlap."""
    many = len(names) > 5
    ax.set_xticks(x, names, fontsize=8, rotation=35 if many else 20, ha="right" if many else "center",
                  rotation_mode="anchor" if many else "default")


def tps_plot(scenario: str, groups: dict, out: Path) -> Path:
    n = len(groups)
    fig, axes = plt.subplots(n, 2, figsize=(11, 3.2 * n + 0.6), squeeze=False)
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
        x = np.arange(len(names))
        ax = axes[i][0]
        ax.bar(x, med, yerr=err, capsize=4, color="#4878a8")
        log = _log_scale(ax, med)
        ax.set_title(f"{g}: TPS (median, 95% CI{', log scale' if log else ''})", fontsize=9)
        _variant_ticks(ax, x, names)
        ax = axes[i][1]
        p50 = [_med(variants[v], "lat_p50_ms") or 0 for v in names]
        p99 = [_med(variants[v], "lat_p99_ms") or 0 for v in names]
        ax.bar(x - 0.2, p50, 0.4, label="p50")
        ax.bar(x + 0.2, p99, 0.4, label="p99")
        log = _log_scale(ax, p50 + p99)
        _variant_ticks(ax, x, names)
        ax.set_title(f"{g}: latency ms (median of runs{', log scale' if log else ''})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{scenario}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def hot_counter_plot(groups: dict, out: Path, scenario: str = "hot-counter") -> Path | None:
    """TPS (median, 95% CI) against clients, one panel per fsync latency, one
    line per level (groups without reader clients only).  A point measured on
    another machine than most of the figure gets a hollow marker, so a line
    that joins two machines is not read as one curve."""
    hosts = Counter(_host_key(r) for variants in groups.values() for recs in variants.values() for r in recs)
    usual = hosts.most_common(1)[0][0] if hosts else None
    series: dict = {}
    for variants in groups.values():
        for v, recs in variants.items():
            meta = recs[0]["variant_config"].get("meta", {})
            if meta.get("readers"):
                continue
            series.setdefault(meta.get("fsync_ms"), {}).setdefault(v, []).append((meta.get("clients"), recs))
    if not series:
        return None
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series) + 0.5, 3.4), squeeze=False)
    order = list(dict.fromkeys(level for levels in series.values() for level in levels))
    color = {level: f"C{i % 10}" for i, level in enumerate(order)}  # one colour per level in every panel
    elsewhere = set()
    for ax, (fs, levels) in zip(axes[0], sorted(series.items(), key=lambda kv: kv[0] or 0)):
        medians = []
        for level, pts in levels.items():
            pts.sort(key=lambda p: p[0])
            xs, ys, lo, hi, other = [], [], [], [], []
            for c, recs in pts:
                t = _vals(recs, "tps")
                if not t:
                    continue
                m = float(np.median(t))
                l, h = stats.bootstrap_median_ci(t)
                xs.append(c)
                ys.append(m)
                lo.append(max(0.0, m - l))
                hi.append(max(0.0, h - m))
                if _host_key(recs[0]) != usual:
                    other.append((c, m))
                    elsewhere.add(_host_key(recs[0]))
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=level, color=color[level])
            if other:
                ax.plot([c for c, _ in other], [m for _, m in other], "o", color=color[level],
                        markerfacecolor="white", zorder=3)
            medians += ys
        log = _log_scale(ax, medians)
        if log:
            ax.set_ylabel("TPS (median, 95% CI, log scale)")
        ax.set_xscale("log", base=2)
        ticks = sorted({c for pts in levels.values() for c, _ in pts if c})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("clients")
        if not log:
            ax.set_ylabel("TPS (median, 95% CI)")
        ax.set_title(f"primary WAL fsync +{fs:g} ms", fontsize=9)
        ax.legend(fontsize=7)
    if elsewhere:
        names = "; ".join(f"kernel {k}" + (f", {c}" if c else "") for k, c in sorted(elsewhere, key=str))
        fig.text(0.5, 0.01, f"hollow markers: measured on another machine ({names}) than the rest "
                 f"(kernel {usual[0]}{', ' + usual[1] if usual[1] else ''})", ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    path = out / f"{scenario}-clients.png"
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


def _type_deltas(a: dict, b: dict) -> list[tuple[str, int]]:
    """Record types by change in combined bytes from a to b (largest first)."""
    ta, tb = (a or {}).get("types") or {}, (b or {}).get("types") or {}
    d = {k: tb.get(k, {}).get("combined", 0) - ta.get(k, {}).get("combined", 0) for k in set(ta) | set(tb)}
    return sorted(d.items(), key=lambda kv: -abs(kv[1]))


def wal_explanation(variants: dict) -> list[str]:
    """Plain-language reading of the WAL breakdown: what differs and why."""
    out = []
    last = {v: recs[-1]["metrics"] for v, recs in variants.items()}
    for phase, label in (("init", "Bulk load (`pgbench -i`)"), ("oltp", "OLTP run")):
        parts = []
        for v, m in last.items():
            tot = (m.get(f"{phase}_waldump") or {}).get("total") or {}
            if tot.get("combined"):
                parts.append(f"`{v}` {tot['combined'] / 1e6:.2f} MB, {tot['fpi'] / tot['combined'] * 100:.0f}% "
                             f"full-page images")
        if parts:
            out.append(f"- {label}: " + "; ".join(parts) + ".")
        for a, b in (("minimal", "replica"), ("replica", "logical")):
            if a in last and b in last:
                wa, wb = last[a].get(f"{phase}_waldump"), last[b].get(f"{phase}_waldump")
                ta, tb = (wa or {}).get("total") or {}, (wb or {}).get("total") or {}
                if not ta.get("combined") or not tb.get("combined"):
                    continue
                diff = tb["combined"] - ta["combined"]
                top = [f"{k} {d:+,} B" for k, d in _type_deltas(wa, wb)[:3] if d]
                out.append(f"  - `{b}` vs `{a}`: {diff:+,} bytes ({diff / ta['combined'] * 100:+.1f}%); "
                           f"largest changes by record type: {', '.join(top) or 'none'}.")
    if out:
        out = ["Reading the breakdown (last run of each level): under `minimal`, data loaded into a table "
               "created or truncated in the same transaction is not WAL-logged (the file is synced at "
               "commit instead), which is why the bulk load shrinks; `logical` adds the information "
               "logical decoding needs (old-tuple identity, more detailed commit records), visible as "
               "larger update and commit records; full-page images (the first change of each page "
               "after a checkpoint) are counted separately.", ""] + out + [""]
    return out


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
    lines += wal_explanation(variants)
    lines.append(f"![wal-volume]({wal_plot(variants, out).name})")
    lines.append("")
    return lines


def top_waits(recs, role: str = "writer", n: int = 4) -> str:
    """Mean share of sampled backends per wait event over the runs, top n."""
    acc: dict[str, float] = {}
    runs = [r["metrics"].get(f"{role}_waits") for r in recs if r["metrics"].get(f"{role}_waits")]
    for w in runs:
        for k, v in w.items():
            acc[k] = acc.get(k, 0.0) + v / len(runs)
    top = sorted(acc.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v * 100:.0f}%" for k, v in top) or "–"


def fsyncs_by_backend(recs, key: str = "wal_io_by_backend") -> str:
    """Median WAL fsyncs per writer transaction by backend type (pg_stat_io);
    key 'standby_wal_io_by_backend' for the first standby's."""
    types = sorted({bt for r in recs for bt in (r["metrics"].get(key) or {})})
    parts = []
    for bt in types:
        v = [r["metrics"][key].get(bt, {}).get("fsyncs", 0.0) / r["metrics"]["transactions"]
             for r in recs if r["metrics"].get(key) is not None and r["metrics"].get("transactions")]
        if v and float(np.median(v)) > 0:
            parts.append(f"{bt} {float(np.median(v)):.4f}")
    return ", ".join(parts) or "–"


def wal_wait_section(variants: dict) -> list[str]:
    """WAL I/O per transaction (pg_stat_wal, pg_stat_io) and where clients wait (pg_stat_activity samples)."""
    if not any(r["metrics"].get("wait_samples") is not None or r["metrics"].get("wal_fsyncs_per_txn") is not None
               for recs in variants.values() for r in recs):
        return []
    lines = ["", "WAL I/O per writer transaction and where the clients were (medians over runs; waits: mean share "
             "of pg_stat_activity samples of the writer clients, `idle` = waiting for pgbench's next "
             "statement; CPU: whole machine busy and stolen by the hypervisor, % of all CPU time, and the "
             "pgbench processes, % of one core):", "",
             "| variant | WAL fsyncs/txn | txn per fsync | fsyncs/txn by backend | standby fsyncs/txn by process "
             "| WAL writes/txn | WAL records/txn "
             "| FPI/txn | wal_buffers_full | machine CPU busy / steal % | pgbench CPU % | writer waits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, recs in variants.items():
        lines.append(f"| {v} | {_fmt(_med(recs, 'wal_fsyncs_per_txn'), 4)} | {_fmt(_med(recs, 'txn_per_wal_fsync'), 1)} "
                     f"| {fsyncs_by_backend(recs)} | {fsyncs_by_backend(recs, 'standby_wal_io_by_backend')} "
                     f"| {_fmt(_med(recs, 'wal_writes_per_txn'), 4)} "
                     f"| {_fmt(_med(recs, 'wal_records_per_txn'), 2)} | {_fmt(_med(recs, 'wal_fpi_per_txn'), 4)} "
                     f"| {_fmt(_med(recs, 'stat_wal_buffers_full'), 0)} | {_fmt(_med(recs, 'host_cpu_busy_pct'), 0)} / {_fmt(_med(recs, 'host_cpu_steal_pct'), 1)} "
                     f"| {_fmt(_med(recs, 'pgbench_cpu_pct'), 0)} | {top_waits(recs)} |")
    if any(r["metrics"].get("read_tps") is not None for recs in variants.values() for r in recs):
        lines += ["", "Reader clients (second pgbench, `SELECT` of the counter):", "",
                  "| variant | readers | read TPS median | read TPS 95% CI | read lat p50 ms | read lat p99 ms "
                  "| reader waits |", "|---|---|---|---|---|---|---|"]
        for v, recs in variants.items():
            rt = _vals(recs, "read_tps")
            if not rt:
                continue
            lo, hi = stats.bootstrap_median_ci(rt)
            lines.append(f"| {v} | {recs[0]['metrics'].get('read_clients')} | {_fmt(float(np.median(rt)))} | "
                         f"{_fmt(lo)}–{_fmt(hi)} | {_fmt(_med(recs, 'read_lat_p50_ms'), 3)} | "
                         f"{_fmt(_med(recs, 'read_lat_p99_ms'), 3)} | {top_waits(recs, 'reader')} |")
    return lines


def render(records: list[dict], out: Path, title: str | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not title:  # the same heading `run` writes
        scenarios = sorted({r.get("scenario") for r in records if r.get("scenario")})
        title = f"pgwal lab: {', '.join(scenarios)}" if scenarios else "pgwal lab report"
    lines = [f"# {title}", ""]
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
        if scenario == "audit":
            from .audit import report as audit_report

            lines += audit_report.section([r for r in records if r.get("scenario") == "audit"])
            continue
        if scenario == "audit-consumer":
            from .audit import report as audit_report

            lines += audit_report.consumer_section([r for r in records if r.get("scenario") == scenario])
            continue
        if scenario == "histories":
            from .history import report as history_report

            lines += history_report.section([r for r in records if r.get("scenario") == scenario])
            continue
        if scenario == "audit-receiver":
            from .audit import report as audit_report

            lines += audit_report.receiver_section([r for r in records if r.get("scenario") == scenario])
            continue
        for g, variants in groups.items():
            first = next(iter(variants.values()))[0]
            vc = first.get("variant_config", {})
            envs = {v: _env_label(recs) for v, recs in variants.items()}
            if len({repr(e) for e in envs.values()}) > 1:  # environments alternate within the group
                env_text = "per variant: " + "; ".join(f"`{v}` {e or 'default'}" for v, e in envs.items())
            else:
                env_text = str(vc.get("env") or "default")
            # what proof.py showed in effect before the group's first run
            proved = first.get("proof")
            proved_text = f"Proved before the first run: {summary(proved)}." if proved else \
                "Not proved (runs from before the lab checked its environment)."
            if any(_meta(recs).get("build") for recs in variants.values()):
                proved_text += " Build proved before each run: " + "; ".join(
                    f"`{v}` {build_proofs(recs)}" for v, recs in variants.items()) + "."
            wl = vc.get("workload", {})
            # a pgbench built-in script is named too (tpcb runs tpcb-like or simple-update)
            wl_text = str(wl.get("name")) + (f" (pgbench -b {wl['builtin']})" if wl.get("builtin") else "")
            lines += [f"### {g}", "",
                      f"Environment: {env_text}; workload {wl_text}, "
                      f"{vc.get('clients')} clients; runs interleaved, {first.get('method', {}).get('duration')} s "
                      f"each.", "", proved_text, "",
                      "| variant | n | TPS median | TPS mean | spread % | TPS 95% CI | lat p50 ms | lat p99 ms "
                      "| WAL B/txn | flush lag ms | replay lag ms | walsender CPU % | walreceiver CPU % "
                      "| walsender WAL reads | replies/s | proxy CPU % |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for v, recs in variants.items():
                s = stats.summary(_vals(recs, "tps"))
                lo, hi = stats.bootstrap_median_ci(_vals(recs, "tps")) if s["n"] else (None, None)
                lines.append(
                    f"| {v} | {s['n']} | {_fmt(s['median'])} | {_fmt(s['mean'])} | {_fmt(s['spread_pct'])} | "
                    f"{_fmt(lo)}–{_fmt(hi)} | {_fmt(_med(recs, 'lat_p50_ms'), 2)} | "
                    f"{_fmt(_med(recs, 'lat_p99_ms'), 2)} | {_fmt(_med(recs, 'wal_bytes_per_txn'), 0)} | "
                    f"{_fmt(_med(recs, 'flush_lag_ms_mean'), 2)} | {_fmt(_med(recs, 'replay_lag_ms_mean'), 2)} | "
                    f"{_fmt(_med(recs, 'walsender_cpu_pct'))} | {_fmt(_med(recs, 'walreceiver_cpu_pct'))} | "
                    f"{_fmt(_med(recs, 'walsender_wal_reads'), 0)} | {_fmt(_med(recs, 'reply_chunks_per_s'), 0)} | "
                    f"{_fmt(_med(recs, 'proxy_cpu_pct'))} |")
            lines += wal_wait_section(variants)
            lines += commit_model_section(variants)
            lines += replay_delay_section(variants)
            if any(r["metrics"].get("table_bytes_before") for recs in variants.values() for r in recs):
                sizes = "; ".join(f"`{v}` {_fmt(_med(recs, 'table_bytes_before') / 1024, 0)} → "
                                  f"{_fmt(_med(recs, 'table_bytes_after') / 1024, 0)}"
                                  for v, recs in variants.items() if _med(recs, "table_bytes_before") is not None)
                lines += ["", f"Workload tables (with indexes), kB at run start → end, medians: {sizes}."]
            changed = sum(1 for recs in variants.values() for r in recs if r["metrics"].get("repl_process_changes"))
            if changed:
                lines += ["", f"Note: in {changed} run(s) a walsender or walreceiver was replaced during the run "
                              "(reconnect); their CPU figures are left out."]
            names = list(variants)
            if len(names) > 1:
                # with a stock baseline: every patched variant against each stock one
                stock = [v for v in names if _meta(variants[v]).get("build") == "stock"]
                if stock:
                    intro = ("Ratios of median TPS with bootstrap 95% CI and Mann-Whitney U: every variant of "
                             "the patched build against each variant of the stock build (`stock:`):")
                    pairs = [(b, v) for v in names if v not in stock for b in stock]
                else:
                    intro = ("Ratios of median TPS with bootstrap 95% CI and Mann-Whitney U, against the "
                             f"group's first variant (`{names[0]}`) and against the previous variant:")
                    pairs = [(names[0], v) for v in names[1:]]
                    pairs += [(names[i - 1], names[i]) for i in range(2, len(names))]
                lines += ["", intro, "", "| variant | vs | ratio | 95% CI | p | verdict |", "|---|---|---|---|---|---|"]
                for base, v in pairs:
                    c = stats.compare(_vals(variants[base], "tps"), _vals(variants[v], "tps"), name_a=base, name_b=v)
                    lines.append(f"| {v} | {base} | {_fmt(c['ratio'], 3)} | {_fmt(c['ci_low'], 3)}–"
                                 f"{_fmt(c['ci_high'], 3)} | {_fmt(c['p'], 3)} | {c['verdict']} |")
            lines.append("")
        if scenario in ("hot-counter", "tpcb-simple"):
            plot = hot_counter_plot(groups, out, scenario)
            if plot:
                lines += [f"![{scenario} by clients]({plot.name})", ""]
        if scenario == "hot-counter":
            lines += ["Published reference (2018, 128 clients, ~0.2 ms fsync, other hardware): 1283 TPS `on`, "
                      "2611 `off`, 3321 with early lock release. With one hot row the row lock is held across "
                      "the commit flush, so `on` is bounded by ~1 / (flush latency + hand-off).", ""]
        if len(groups) <= 8:
            lines += [f"![{scenario}]({tps_plot(scenario, groups, out).name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
