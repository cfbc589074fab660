import math

import numpy as np
import pytest

from pgwal_lab import stats


def test_summary_known_values():
    s = stats.summary([1, 2, 3, 4, 100])
    assert s["n"] == 5
    assert s["median"] == 3
    assert s["mean"] == 22
    assert s["min"] == 1 and s["max"] == 100
    assert s["spread_pct"] == pytest.approx(99 / 3 * 100)
    assert s["stdev"] == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))


def test_summary_ignores_none_and_empty():
    assert stats.summary([None, 5])["n"] == 1
    assert stats.summary([])["median"] is None


def test_mann_whitney_exact_value():
    # completely separated samples of 5: exact two-sided p = 2 / C(10, 5) = 2/252
    p = stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert p == pytest.approx(2 / 252, rel=1e-6)


def test_bootstrap_ratio_ci_brackets_ratio():
    a = [100, 101, 99, 100, 102, 98, 100, 101, 99, 100]
    b = [110, 111, 109, 110, 112, 108, 110, 111, 109, 110]
    r, lo, hi = stats.bootstrap_ratio_ci(a, b)
    assert r == pytest.approx(1.10)
    assert lo <= r <= hi
    assert lo > 1.05 and hi < 1.15


def test_compare_significant_difference():
    rng = np.random.default_rng(3)
    a = list(1000 + rng.normal(0, 10, 10))
    b = list(1100 + rng.normal(0, 10, 10))
    c = stats.compare(a, b, name_a="on", name_b="off")
    assert c["significant"]
    assert c["p"] < 0.001
    assert c["verdict"].startswith("off +")


def test_compare_no_significant_difference():
    rng = np.random.default_rng(4)
    a = list(1000 + rng.normal(0, 50, 10))
    b = list(1000 + rng.normal(0, 50, 10))
    c = stats.compare(a, b)
    assert not c["significant"]
    assert c["ci_low"] < 1 < c["ci_high"]
    assert c["verdict"] == "no significant difference"


def test_compare_too_few_runs():
    c = stats.compare([1000], [2000])
    assert not c["significant"]
    assert math.isnan(c["ci_low"])
    assert c["verdict"].startswith("insufficient runs")


def test_bootstrap_median_ci():
    lo, hi = stats.bootstrap_median_ci([5, 5, 5, 5])
    assert lo == hi == 5
    lo, hi = stats.bootstrap_median_ci(list(range(1, 101)))
    assert lo < 50.5 < hi


def test_compare_inconclusive_with_three_runs():
    c = stats.compare([100, 101, 102], [200, 201, 202])
    assert not c["significant"]
    assert c["ci_low"] > 1
    assert c["p"] == pytest.approx(0.1)
    assert c["verdict"].startswith("inconclusive")
