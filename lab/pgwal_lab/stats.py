"""Statistics for benchmark runs: summaries, bootstrap confidence intervals
of the ratio of medians, Mann-Whitney U, and an honest verdict."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps


def summary(xs) -> dict:
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    if a.size == 0:
        return {"n": 0, "median": None, "mean": None, "stdev": None, "min": None, "max": None, "spread_pct": None}
    med = float(np.median(a))
    return {
        "n": int(a.size),
        "median": med,
        "mean": float(a.mean()),
        "stdev": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
        # (max - min) / median: the run-to-run spread the published studies reported
        "spread_pct": float((a.max() - a.min()) / med * 100) if med else None,
    }


def bootstrap_median_ci(xs, level: float = 0.95, n_boot: int = 5000, seed: int = 1) -> tuple[float, float]:
    a = np.asarray(xs, dtype=float)
    if a.size < 2:
        v = float(a[0]) if a.size else math.nan
        return v, v
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    lo, hi = np.percentile(meds, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def bootstrap_ratio_ci(a, b, level: float = 0.95, n_boot: int = 5000, seed: int = 1) -> tuple[float, float, float]:
    """Ratio median(b)/median(a) and its percentile bootstrap CI (each sample
    resampled independently)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ratio = float(np.median(b) / np.median(a))
    if a.size < 2 or b.size < 2:
        return ratio, math.nan, math.nan
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    r = mb / ma
    lo, hi = np.percentile(r, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return ratio, float(lo), float(hi)


def mann_whitney(a, b) -> float:
    """Two-sided Mann-Whitney U p-value (nan when a sample is too small)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    return float(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def compare(a, b, alpha: float = 0.05, name_a: str = "A", name_b: str = "B", level: float = 0.95) -> dict:
    """Compare sample b against baseline a.  Significant only when the ratio
    CI excludes 1 and Mann-Whitney p < alpha; otherwise the verdict is
    'no significant difference'."""
    a = [x for x in a if x is not None]
    b = [x for x in b if x is not None]
    if not a or not b:
        return {"ratio": None, "ci_low": None, "ci_high": None, "p": None, "significant": False,
                "verdict": "no data"}
    ratio, lo, hi = bootstrap_ratio_ci(a, b, level=level)
    p = mann_whitney(a, b)
    significant = (not math.isnan(lo)) and not math.isnan(p) and (lo > 1 or hi < 1) and p < alpha
    ci_excludes_1 = (not math.isnan(lo)) and (lo > 1 or hi < 1)
    reachable = min(len(a), len(b)) >= 1 and 2 / math.comb(len(a) + len(b), len(a)) < alpha
    if min(len(a), len(b)) < 2:
        verdict = "insufficient runs (n < 2): not tested"
    elif significant:
        verdict = f"{name_b} {'+' if ratio > 1 else '-'}{abs(ratio - 1) * 100:.1f}% vs {name_a} (significant)"
    elif ci_excludes_1 and not reachable:
        verdict = (f"inconclusive: the CI excludes 1, but with {len(a)} and {len(b)} runs Mann-Whitney "
                   f"cannot reach p < {alpha}; run more iterations")
    else:
        verdict = "no significant difference"
        if not reachable:
            verdict += f" (with {len(a)} and {len(b)} runs no difference could reach p < {alpha})"
    return {"ratio": ratio, "ci_low": lo, "ci_high": hi, "p": p, "significant": significant, "verdict": verdict}
