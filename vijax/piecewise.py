"""Piecewise linear and quadratic bounds on the logistic likelihood (Marlin, Khan & Murphy 2011).

The logistic log-partition f(x) = log(1 + eˣ) is bounded above by R pieces,

$$
f(x) \\le \\bar f(x) = c_r x^2 + b_r x + a_r, \\qquad x \\in [t_{r-1}, t_r),
$$

so that log σ(x) ≥ −f̄(−x), a logistic site bound with closed-form Gaussian expectations and maximum error ε_R:
the G-KL bound on it is a lower bound on log Z, within N·ε_R of the exact G-KL bound (Khan thesis, Thm 4.6.2):

>>> model = vj.piecewise.bound_logistic_sites(vj.glm.logistic_regression(X, y), "quadratic", 20)
>>> post = vj.infer(model, vj.GKL())        # post.log_z ≤ the exact G-KL bound ≤ log Z

``kind="linear"``: f̄ = max_r (b_r x + a_r), the chord interpolant (the site is log-concave). ``kind="quadratic"``:
minimax upper quadratics, c_r ≥ 0 (ε_20 = 1.4e-4 against 3.3e-3), jumping by less than ε_R at the breakpoints.
Pieces are symmetric ((c, b, a) on [l, h] and (c, 1 − b, a) on [−h, −l]) with equal maximum error. Tables for
R = 3 … 20 ship with vijax (`table`); `fit` computes them (with SciPy; ``benchmarks/fit_piecewise.py``).
"""

from __future__ import annotations

import math

import equinox as eqx
import numpy as np

from ._piecewise import KINDS, PIECES, expected, log_expected_exp_neg, table, value
from .potentials import Logistic, Masked, PiecewiseLogistic

__all__ = ["KINDS", "PIECES", "table", "max_error", "value", "expected", "log_expected_exp_neg", "fit",
           "bound_logistic_sites"]
__dir__ = __all__.copy

# The shipped bounds hold with this much room, so rounding in their evaluation never breaks them.
MARGIN = 1e-12


def max_error(kind: str, pieces: int) -> float:
    """ε_R = max_x f̄(x) − f(x) of the shipped bound."""
    return table(kind, pieces)[2]


def bound_logistic_sites(model, kind: str = "quadratic", pieces: int = 20):
    """``model`` with every `Logistic` site group (masked or not) replaced by `PiecewiseLogistic(pieces, kind)`.

    With `vj.GKL` the result's ``log_z`` is a lower bound on ``model``'s log Z, at most N·ε_R below its G-KL bound."""
    site = PiecewiseLogistic(pieces, kind)

    def replaced(potential):
        if isinstance(potential, Masked):  # padded sites (`vj.pad_sites`) stay masked out
            inner = replaced(potential.potential)
            return potential if inner is potential.potential else Masked(inner, potential.mask)
        return site if isinstance(potential, Logistic) else potential

    def group(g):
        potential = replaced(g.potential)
        return g if potential is g.potential else eqx.tree_at(lambda g: g.potential, g, potential)

    return model.replace(sites=tuple(group(g) for g in model.sites))



def _f(x):
    return np.logaddexp(0.0, x)


def _scipy():
    try:
        import scipy.optimize as opt
    except ImportError as err:  # pragma: no cover - scipy ships with the test and bench extras
        raise ImportError("vijax.piecewise.fit needs SciPy (pip install scipy); the shipped tables "
                          "(vijax.piecewise.table) do not.") from err
    return opt


def _chord(l, h):
    """The chord of f over [l, h] as (c, b, a) and its maximum gap (at f'(x) = slope)."""
    slope = min(max((_f(h) - _f(l)) / (h - l), 1e-300), 1 - 1e-15)  # (0, 1) also after rounding
    x = math.log(slope / (1 - slope))
    a = _f(l) - slope * l
    return (0.0, slope, a), slope * x + a - _f(x)


def _quadratic(l, h, num=65):
    """The minimax upper quadratic over [l, h] on a Chebyshev grid (the best uniform fit of (f − chord)/max|f − chord|
    by linear programming, error E, shifted up by E), as (c, b, a) and its gap 2E."""
    opt = _scipy()
    mid, half = 0.5 * (h + l), 0.5 * (h - l)
    u = np.cos(np.pi * np.arange(num) / (num - 1))  # u[0] = 1 (x = h), u[-1] = −1 (x = l)
    y = _f(mid + half * u)
    chord_mean, chord_slope = 0.5 * (y[0] + y[-1]), 0.5 * (y[0] - y[-1])
    residual = y - chord_mean - chord_slope * u
    scale = max(float(np.max(np.abs(residual))), 1e-300)
    r = residual / scale
    basis = np.stack([u**2, u, np.ones_like(u)], 1)
    A = np.block([[basis, -np.ones((num, 1))], [-basis, -np.ones((num, 1))]])
    res = opt.linprog([0, 0, 0, 1], A_ub=A, b_ub=np.concatenate([r, -r]),
                      bounds=[(0, None), (None, None), (None, None), (0, None)], method="highs",
                      options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    alpha, beta, gamma, err = res.x * scale
    beta, gamma = beta + chord_slope, gamma + chord_mean
    c = alpha / half**2
    b = beta / half - 2 * c * mid
    a = gamma - beta * mid / half + c * mid**2 + err
    return (c, b, a), 2 * err


def _extend(l, eps, error):
    """The h > l at which the best piece over [l, h] has gap ``eps`` (``error(l, h)`` increases in h)."""
    opt = _scipy()
    far = l + 30.0
    if error(l, far) <= eps:
        return far
    return opt.brentq(lambda h: error(l, h) - eps, l + 1e-9, far, xtol=1e-11)


def _half_layout(eps, interior, error):
    """Breakpoints from t_1 (where f(t_1) = ε) towards 0, greedy with gap ε, and how far from fitting."""
    edges = [math.log(math.expm1(eps))]
    for _ in range(interior // 2):
        edges.append(_extend(edges[-1], eps, error))
    if interior % 2 == 0:
        return edges, edges[-1]
    u = edges[-1]
    return edges, (1.0 if u >= 0 else eps - error(u, -u))


def _gap_extremes(coef, l, h, num=4001):
    """(min, max) of c x² + b x + a − f(x) over [l, h]: every local extremum on a grid, refined."""
    opt = _scipy()
    gap = lambda x: (coef[0] * x + coef[1]) * x + coef[2] - _f(x)
    x = np.linspace(l, h, num)
    g = gap(x)
    out = []
    for sign in (1, -1):
        v = sign * g
        padded = np.concatenate([[np.inf], v, [np.inf]])
        candidates = np.flatnonzero((v <= padded[:-2]) & (v <= padded[2:]))
        best = float(v.min())
        for i in candidates:
            lo, hi = x[max(i - 1, 0)], x[min(i + 1, num - 1)]
            r = opt.minimize_scalar(lambda t: sign * gap(t), bounds=(lo, hi), method="bounded",
                                    options={"xatol": 1e-14})
            best = min(best, float(r.fun))
        out.append(sign * best)
    return out[0], out[1]


def fit(kind: str, pieces: int):
    """The minimax R-piece bound of ``kind`` ("linear" or "quadratic"), for any R ≥ 2 (needs SciPy).

    ε is found by bisection so that a greedy layout of pieces with gap ε from t_1 (f(t_1) = ε) reaches 0 exactly,
    then mirrored; each piece is lifted so that its smallest gap is `MARGIN` > 0. Returns a dict of plain floats:
    ``breakpoints`` (R − 1,), ``coefficients`` (R, 3) as rows (c_r, b_r, a_r) and ``max_error``."""

    if kind not in KINDS:
        raise ValueError(f"piecewise.fit: `kind` must be one of {KINDS}, got {kind!r}.")
    if int(pieces) < 2:
        raise ValueError(f"piecewise.fit: `pieces` must be at least 2, got {pieces!r}.")
    opt = _scipy()
    piece = _chord if kind == "linear" else _quadratic
    error = lambda l, h: piece(l, h)[1]
    interior = int(pieces) - 2
    eps = opt.brentq(lambda e: _half_layout(e, interior, error)[1], 1e-10, math.log(2) + 1e-9, xtol=1e-15,
                     rtol=1e-8)
    left, _ = _half_layout(eps, interior, error)
    if interior % 2 == 0:
        left[-1] = 0.0
    half = list(zip(left[:-1], left[1:]))
    intervals = half + ([] if interior % 2 == 0 else [(left[-1], -left[-1])])

    coefs = []
    for l, h in intervals:
        c, b, a = piece(l, h)[0]
        coefs.append((c, b, a - _gap_extremes((c, b, a), l, h)[0] + MARGIN))
    coefs += [(c, 1.0 - b, a) for c, b, a in coefs[:len(half)][::-1]]
    intervals += [(-h, -l) for l, h in half[::-1]]
    outer = _f(left[0]) + MARGIN
    coefs = [(0.0, 0.0, outer)] + coefs + [(0.0, 1.0, outer)]
    breakpoints = [left[0]] + [h for _, h in intervals]
    worst = max([outer] + [_gap_extremes(p, l, h)[1] for p, (l, h) in zip(coefs[1:-1], intervals)])
    if kind == "linear":  # the knots are shared, so the pieces meet: f̄ is the max of its lines
        coefs = [(0.0, b, a) for _, b, a in coefs]
    return {"breakpoints": [float(t) for t in breakpoints],
            "coefficients": [[float(v) for v in p] for p in coefs],
            "max_error": float(worst)}
