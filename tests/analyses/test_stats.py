"""analyses.stats against independent values: statistics tables, the closed forms of Student's t for 1 and 2
degrees of freedom, interval formulas by hand, and enumeration of every sequence of choices."""

import itertools
import math
from collections import Counter

import pytest

from analyses.stats import max_count_p_value, t_interval, t_quantile, t_tail, wilson_interval


@pytest.mark.parametrize("df, value", [(1, 12.706204736), (2, 4.302652730), (7, 2.364624252), (30, 2.042272456)])
def test_t_quantile_matches_tables(df, value):  # Student's t 0.975 quantiles (any statistics table)
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-7)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=1e-7)


@pytest.mark.parametrize("p,df,table", [(0.975, 4, 2.776), (0.975, 9, 2.262), (0.8, 10, 0.879), (0.8, 4, 0.941),
                                        (0.5, 3, 0.0)])
def test_t_quantiles_match_the_published_table(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1.5e-3)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=1.5e-3)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.7])
def test_t_tail_closed_forms(t):
    """P(|T| > t): ν = 1 (Cauchy) 1 − (2/π)·arctan t; ν = 2: 1 − t/√(2 + t²)."""
    assert t_tail(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-10)
    assert t_tail(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-10)
    assert t_tail(2.364624252, 7) == pytest.approx(0.05, abs=1e-9)  # the table's t_0.975,7


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.9995])
def test_t_quantile_closed_forms(p):
    """ν = 1 is Cauchy: tan(π(p − ½)); ν = 2: (2p − 1)·√(2 / (4p(1 − p))); far tails included."""
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-8)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-8)


def test_t_quantile_takes_fractional_degrees_of_freedom():  # Welch's ν: between its integer neighbours
    assert t_quantile(0.975, 1) > t_quantile(0.975, 1.3) > t_quantile(0.975, 2)
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0.975, 0.5)


def test_intervals():
    t = t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446305 * math.sqrt(5 / 3) / 2
    assert t["mean"] == 2.5 and t["low"] == pytest.approx(2.5 - half) and t["high"] == pytest.approx(2.5 + half)
    assert t_interval([None, 3.0, float("nan")])["n"] == 1 and t_interval([])["mean"] is None
    w = wilson_interval(8, 8)  # Wilson (1927): n / (n + z²) for k = n
    assert w["high"] == 1.0 and w["low"] == pytest.approx(8 / (8 + 1.959963984540054 ** 2))


def test_max_count_p_value_is_the_enumerated_probability():
    for m, n, k in ((5, 8, 4), (2, 3, 4), (3, 6, 2), (1, 4, 3), (4, 4, 4)):  # against every sequence of choices
        seqs = list(itertools.product(range(k), repeat=n))
        brute = sum(max(Counter(q).values()) >= m for q in seqs) / len(seqs)
        assert max_count_p_value(m, n, k) == pytest.approx(brute, abs=1e-12)
