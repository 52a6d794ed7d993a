"""Statistics over training seeds: Student's t quantiles and intervals, Wilson's score interval for a proportion,
and the exact chance of a largest count among equally likely outcomes. Used by the seed sweeps (`analyses.sweep`)
and the exposure-bias experiment (`analyses.exposure_bias`); pure Python, float64.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

__all__ = ["t_quantile", "t_tail", "t_interval", "wilson_interval", "max_count_p_value"]

_PANELS = 2000  # Simpson's rule panels (even)


def _t_mass(theta: float, df: float) -> float:
    """P(0 < T < √ν·tan θ) for Student's t with ν = `df`: under t = √ν tan θ the density
    Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) · (1 + t²/ν)^(−(ν+1)/2) dt becomes Γ((ν+1)/2) / (√π Γ(ν/2)) · cos^(ν−1) θ dθ, smooth
    and bounded on [0, π/2) for ν ≥ 1, integrated here by Simpson's rule."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    h = theta / _PANELS
    total = 0.0
    for i in range(_PANELS + 1):
        w = 1 if i in (0, _PANELS) else 4 if i % 2 else 2
        total += w * math.cos(i * h) ** (df - 1)
    return c * total * h / 3


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` ≥ 1 degrees of freedom (not necessarily an integer: Welch's), by
    bisection on θ in (0, π/2) of `_t_mass` (t = √ν tan θ, so no bracket on t is needed); t₀.₉₇₅,₇ = 2.364624."""
    if not 0 < p < 1 or not df >= 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    target = abs(p - 0.5)
    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_mass(mid, df) < target else (lo, mid)
    t = math.sqrt(df) * math.tan((lo + hi) / 2)
    return t if p > 0.5 else -t


def t_tail(t: float, df: float) -> float:
    """P(|T| > t) for Student's t with `df` ≥ 1 degrees of freedom and t ≥ 0: 1 − 2·P(0 < T < t) (`_t_mass` at
    θ = arctan(t/√ν))."""
    if not t >= 0 or not df >= 1:
        raise ValueError(f"need t >= 0 and df >= 1, got t={t}, df={df}")
    return 1 - 2 * _t_mass(math.atan(t / math.sqrt(df)), df)


def t_interval(values, level: float = 0.95) -> dict:
    """`{"n", "mean", "sd", "low", "high"}`: Student's t interval mean ± t_{(1+level)/2, n−1} · s/√n of the finite
    values among `values` (None and NaN left out; s the sample standard deviation; Student 1908); None bounds below
    2 values."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "low": None, "high": None}
    mean = sum(v) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "low": None, "high": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half}


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> dict:
    """`{"k", "n", "fraction", "low", "high"}`: Wilson's score interval for k successes in n trials (Wilson 1927;
    95 % with the default z, the normal 0.975 quantile)."""
    if n == 0:
        return {"k": 0, "n": 0, "fraction": None, "low": None, "high": None}
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return {"k": k, "n": n, "fraction": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half)}


def max_count_p_value(m: int, n: int, k: int) -> float:
    """P(the most frequent of `k` equally likely outcomes occurs ≥ `m` times in `n` independent draws): the exact
    p-value of "the choices are uniform" against the observed largest count `m` (the number of sequences with every
    count ≤ m − 1 is n! [xⁿ] (Σ_{j<m} xʲ/j!)ᵏ, the exponential generating function of bounded multinomial counts)."""
    if m <= 0 or n == 0:
        return 1.0
    term = [Fraction(1, math.factorial(j)) for j in range(min(m, n + 1))]
    poly = [Fraction(1)]
    for _ in range(k):
        nxt = [Fraction(0)] * (n + 1)
        for i, a in enumerate(poly):
            for j, b in enumerate(term):
                if i + j <= n:
                    nxt[i + j] += a * b
        poly = nxt
    return float(1 - poly[n] * math.factorial(n) / Fraction(k) ** n)
