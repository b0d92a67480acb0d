"""Piecewise upper bounds on the logistic log-partition and their Gaussian expectations.

With f(x) = log(1 + eˣ) (so log σ(x) = −f(−x)), an R-piece bound is

.. math::

    f(x) \\le \\bar f(x) = c_r x^2 + b_r x + a_r \\quad\\text{for } x \\in [t_{r-1}, t_r),
    \\qquad t_0 = -\\infty < t_1 < \\dots < t_{R-1} < t_R = \\infty,

with c_r = 0 for the piecewise linear bound (then f̄ = max_r (b_r x + a_r), a convex function) and
c_r ≥ 0 for the piecewise quadratic one (Marlin, Khan & Murphy 2011; Khan thesis §4.5). The two
unbounded pieces are always f(t_1) and x + f(−t_{R−1}): any other piece on a half line has an
unbounded gap. Under x ~ N(m, s²), with z = (x − m)/s and the truncated standard-normal moments
M_k = ∫ z^k N(z) dz over [(t_{r−1} − m)/s, (t_r − m)/s],

.. math::

    \\langle \\bar f \\rangle = \\sum_r c_r s^2 M_2 + s(2 c_r m + b_r) M_1 + (c_r m^2 + b_r m + a_r) M_0,

    \\log\\langle e^{-\\bar f}\\rangle = \\operatorname{logsumexp}_r \\Big[-\\tfrac12\\log k_r
      + \\frac{2 m \\beta_r + \\beta_r^2 s^2 - 2 c_r m^2}{2 k_r} - a_r
      + \\log\\big(\\Phi(\\tilde h_r) - \\Phi(\\tilde l_r)\\big)\\Big],

k_r = 1 + 2c_r s², β_r = −b_r, with l̃, h̃ the breakpoints standardised under the tilted Gaussian
N((m + β_r s²)/k_r, s²/k_r). Differences of Φ are taken in the tail where they are small, and
logs of them through `log_ndtr`, so both are accurate for |m| ≫ s. The coefficient tables are
fitted offline by `vijax.piecewise.fit` and shipped in `_piecewise_tables.py`.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr, logsumexp, ndtr

from ._piecewise_tables import TABLES

KINDS = ("linear", "quadratic")
PIECES = tuple(sorted(TABLES["quadratic"]))

_SQRT_2PI = math.sqrt(2 * math.pi)
# Standardised breakpoints are clipped here: N(z) and Φ(−z) underflow to 0 beyond 40 in float64.
_CLIP = 40.0
# For the exponentiated bound the clip only guards ±∞ arithmetic; log Φ(−1e3) is still finite.
_CLIP_LOG = 1e3


def check(kind: str, pieces: int, owner: str = "piecewise") -> None:
    if kind not in KINDS:
        raise ValueError(f"{owner}: `kind` must be one of {KINDS}, got {kind!r}.")
    if not isinstance(pieces, (int, np.integer)) or int(pieces) not in TABLES[kind]:
        shipped = f"{PIECES[0]} … {PIECES[-1]}" if PIECES else "(none shipped)"
        raise ValueError(f"{owner}: `pieces` must be an integer in {shipped} (the shipped tables), got "
                         f"{pieces!r}; fit other sizes with vijax.piecewise.fit.")


@functools.lru_cache(maxsize=None)
def table(kind: str, pieces: int):
    """``(breakpoints (R−1,), coefficients (R, 3) as columns (c, b, a), max_error)`` in NumPy float64."""
    check(kind, pieces)
    entry = TABLES[kind][int(pieces)]
    return (np.asarray(entry["breakpoints"], np.float64), np.asarray(entry["coefficients"], np.float64),
            float(entry["max_error"]))


def _constants(kind, pieces, dtype):
    t, coef, _ = table(kind, pieces)
    t = jnp.asarray(t, dtype)
    c, b, a = (jnp.asarray(coef[:, i], dtype) for i in range(3))
    return t, c, b, a


def value(kind: str, pieces: int, x):
    """f̄(x), elementwise."""
    x = jnp.asarray(x)
    t, c, b, a = _constants(kind, pieces, x.dtype)
    r = jnp.sum(x[..., None] >= t, axis=-1)
    return (c[r] * x + b[r]) * x + a[r]


def _standardised_edges(t, mean, sd, clip):
    """(lower, upper) standardised edges of every piece, shape ``mean.shape + (R,)``."""
    inner = jnp.clip((t - mean[..., None]) / sd[..., None], -clip, clip)
    ones = jnp.ones(mean.shape + (1,), inner.dtype)
    return jnp.concatenate([-clip * ones, inner], -1), jnp.concatenate([inner, clip * ones], -1)


def _safe_sd(sd):
    return jnp.maximum(sd, jnp.finfo(sd.dtype).tiny ** 0.25)


def expected(kind: str, pieces: int, mean, sd):
    """⟨f̄(x)⟩ for x ~ N(mean, sd²), elementwise over the broadcast of ``mean`` and ``sd``."""
    mean, sd = jnp.broadcast_arrays(mean, sd)
    t, c, b, a = _constants(kind, pieces, jnp.result_type(mean, sd, float))
    s = _safe_sd(sd)
    lo, hi = _standardised_edges(t, mean, s, _CLIP)
    pdf = lambda z: jnp.exp(-0.5 * z**2) / _SQRT_2PI
    m0 = jnp.where(lo > 0, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))
    m1 = pdf(lo) - pdf(hi)
    m2 = m0 + lo * pdf(lo) - hi * pdf(hi)
    m, s = mean[..., None], s[..., None]
    terms = c * s**2 * m2 + s * (2 * c * m + b) * m1 + ((c * m + b) * m + a) * m0
    return jnp.sum(terms, -1)


def _log_ndtr_difference(lo, hi):
    """log(Φ(hi) − Φ(lo)) for lo ≤ hi, in the tail where the difference is small; −∞ when lo = hi."""
    upper = lo > 0
    u, v = jnp.where(upper, -hi, lo), jnp.where(upper, -lo, hi)  # Φ(hi) − Φ(lo) = Φ(v) − Φ(u)
    lu, lv = log_ndtr(u), log_ndtr(v)
    empty = v <= u
    gap = jnp.where(empty, -1.0, lu - lv)
    return jnp.where(empty, -jnp.inf, lv + jnp.log1p(-jnp.exp(gap)))


def log_expected_exp_neg(kind: str, pieces: int, mean, sd):
    """log⟨exp(−f̄(x))⟩ for x ~ N(mean, sd²): a lower bound on log⟨σ(−x)⟩, in closed form."""
    mean, sd = jnp.broadcast_arrays(mean, sd)
    t, c, b, a = _constants(kind, pieces, jnp.result_type(mean, sd, float))
    s = _safe_sd(sd)
    m, s2 = mean[..., None], (s**2)[..., None]
    k = 1 + 2 * c * s2
    beta = -b
    log_scale = -0.5 * jnp.log(k) + (2 * m * beta + beta**2 * s2 - 2 * c * m**2) / (2 * k) - a
    tilted_mean, tilted_sd = (m + beta * s2) / k, jnp.sqrt(s2 / k)
    # Piece r spans [t_{r−1}, t_r) standardised under its own tilted Gaussian; t_0 = −∞, t_R = ∞.
    ends = jnp.full(mean.shape + (1,), _CLIP_LOG, log_scale.dtype)
    lo = jnp.concatenate([-ends, (t - tilted_mean[..., 1:]) / tilted_sd[..., 1:]], -1)
    hi = jnp.concatenate([(t - tilted_mean[..., :-1]) / tilted_sd[..., :-1], ends], -1)
    lo, hi = jnp.clip(lo, -_CLIP_LOG, _CLIP_LOG), jnp.clip(hi, -_CLIP_LOG, _CLIP_LOG)
    return logsumexp(log_scale + _log_ndtr_difference(lo, hi), axis=-1)
