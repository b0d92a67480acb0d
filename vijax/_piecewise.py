"""Gaussian expectations of the piecewise bounds f̄(x) = c_r x² + b_r x + a_r on [t_{r−1}, t_r) of `vijax.piecewise`.

Under x ~ N(m, s²), log⟨e^{−f̄}⟩ is a logsumexp over pieces of truncated-Gaussian masses under each piece's tilted
Gaussian N((m − b_r s²)/k_r, s²/k_r), k_r = 1 + 2c_r s². ⟨f̄⟩ is summed by parts over the inner edges: with
Δc_k = c_{k+1} − c_k (likewise Δb, Δa, Δg_k(x) = Δc_k x² + Δb_k x + Δa_k), z_k = (t_k − m)/s, r* the piece holding
m and the signed tail mass T_k = −Φ(z_k) (z_k ≤ 0) or Φ(−z_k) (nothing cancels for |m| ≫ s),

$$
\\langle \\bar f \\rangle = c_{r^*} (m^2 + s^2) + b_{r^*} m + a_{r^*}
+ \\sum_{k} T_k \\big(\\Delta g_k(m) + \\Delta c_k s^2\\big)
+ s N(z_k) \\big(2 \\Delta c_k m + \\Delta b_k + \\Delta c_k s z_k\\big),
$$

whose derivatives in (m, s) are sums over the same edges (`_expected_parts`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr, logsumexp

from ._piecewise_tables import TABLES

KINDS = ("linear", "quadratic")
PIECES = tuple(sorted(TABLES["quadratic"]))

_SQRT_2PI = math.sqrt(2 * math.pi)
_CLIP = 40.0  # standardised breakpoints: N(z) and Φ(−z) underflow to 0 beyond 40 in float64
_CLIP_LOG = 1e3  # for log⟨e^{−f̄}⟩ only against ±∞ arithmetic: log Φ(−1e3) is still finite


def check(kind: str, pieces: int, owner: str = "piecewise") -> None:
    """Raise unless ``kind`` and ``pieces`` name a shipped table."""
    if kind not in KINDS:
        raise ValueError(f"{owner}: `kind` must be one of {KINDS}, got {kind!r}.")
    if not isinstance(pieces, (int, np.integer)) or int(pieces) not in TABLES[kind]:
        raise ValueError(f"{owner}: `pieces` must be an integer in {PIECES[0]} … {PIECES[-1]} (the shipped tables), "
                         f"got {pieces!r}; fit other sizes with vijax.piecewise.fit.")


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


def _safe_sd(sd):
    return jnp.maximum(sd, jnp.finfo(sd.dtype).tiny ** 0.25)


def expected(kind: str, pieces: int, mean, sd):
    """⟨f̄(x)⟩ for x ~ N(mean, sd²), elementwise; differentiable to any order, first derivatives in closed form."""
    mean, sd = jnp.broadcast_arrays(mean, sd)
    dtype = jnp.result_type(mean, sd, float)
    # The floor on sd stays outside the custom rule, so autodiff gives it its zero derivative.
    return _expected(kind, int(pieces), mean.astype(dtype), _safe_sd(sd.astype(dtype)))


def _expected_parts(kind, pieces, mean, s, with_gradient):
    """⟨f̄⟩ and, if asked, its partial derivatives in (mean, s > 0), as sums over the inner edges.

    With G_k = 2Δc_k s + Δg_k(t_k)/s: ∂_m⟨f̄⟩ = 2c_{r*}m + b_{r*} + Σ_k T_k(2Δc_k m + Δb_k) + N(z_k)G_k and
    ∂_s⟨f̄⟩ = 2c_{r*}s + Σ_k 2T_kΔc_k s + N(z_k)(2Δc_k m + Δb_k + z_k G_k)."""
    t, c, b, a = _constants(kind, pieces, mean.dtype)
    dc, db, da = jnp.diff(c), jnp.diff(b), jnp.diff(a)
    quadratic = lambda c, b, a, x: (c * x + b) * x + a
    # Clipped edges have T = N = 0 exactly, as for ±∞, and carry no derivative (as under jnp.clip).
    z = jnp.clip((t - mean[..., None]) / s[..., None], -_CLIP, _CLIP)
    upper = z > 0
    # T = ±Φ(−|z|) by erfc; a `where`, not jnp.abs (derivative 0 at 0), for second derivatives on a breakpoint.
    tail = jnp.where(upper, 0.5, -0.5) * jax.lax.erfc(jnp.where(upper, z, -z) * math.sqrt(0.5))
    pdf = jnp.exp(-0.5 * z**2) / _SQRT_2PI
    r = jnp.sum(~upper, -1)  # r* (from 0): the number of breakpoints at or below the mean
    m, sk = mean[..., None], s[..., None]
    d_slope = 2 * dc * m + db  # Δg_k'(m)
    edge_terms = [tail * (quadratic(dc, db, da, m) + dc * sk**2) + sk * pdf * (d_slope + dc * sk * z)]
    if with_gradient:
        g = 2 * dc * sk + quadratic(dc, db, da, t) / sk
        edge_terms += [tail * d_slope + pdf * g, 2 * sk * tail * dc + pdf * (d_slope + z * g)]
    sums = jnp.sum(jnp.stack(edge_terms, -2), -1)  # one reduction: XLA reads the edge arrays once

    value = quadratic(c[r], b[r], a[r], mean) + c[r] * s**2 + sums[..., 0]
    if not with_gradient:
        return value
    return value, 2 * c[r] * mean + b[r] + sums[..., 1], 2 * c[r] * s + sums[..., 2]


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _expected(kind, pieces, mean, s):
    return _expected_parts(kind, pieces, mean, s, with_gradient=False)


@_expected.defjvp
def _expected_jvp(kind, pieces, primals, tangents):
    # Ordinary jnp code of (mean, s), so autodiff through this rule gives correct second derivatives.
    value, d_mean, d_sd = _expected_parts(kind, pieces, *primals, with_gradient=True)
    return value, d_mean * tangents[0] + d_sd * tangents[1]


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
