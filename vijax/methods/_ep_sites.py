"""EP's site parameters and per-site maths (cavity, undamped step, moment residual), shared by the EP methods."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _checks
from ..model import LatentLinearModel


class SiteParams(eqx.Module):
    """EP sites t̃_n(x) = exp(ν_n x − ½ τ_n x²): ``precision`` the τ (``(N_g,)`` per group; may be negative),
    ``shift`` the ν."""

    precision: tuple[jax.Array, ...]
    shift: tuple[jax.Array, ...]

    @staticmethod
    def zeros(model: LatentLinearModel, shapes_only: bool = False) -> "SiteParams":
        """Sites that contribute nothing (with ``shapes_only``, their `jax.ShapeDtypeStruct`s)."""
        make = jax.ShapeDtypeStruct if shapes_only else jnp.zeros
        zeros = tuple(make((g.num_sites,), model.dtype) for g in model.sites)
        return SiteParams(zeros, zeros)

    def __add__(self, other: "SiteParams") -> "SiteParams":
        return jax.tree_util.tree_map(jnp.add, self, other)

    def scale(self, alpha) -> "SiteParams":
        return jax.tree_util.tree_map(lambda a: alpha * a, self)


class _Evaluation(NamedTuple):
    """q at a set of sites, and each site's cavity and tilted moments (tuples: one entry per group)."""

    value: jax.Array  # the energy, or the double loop's inner objective G when anchored
    marginal_mean: tuple
    marginal_var: tuple
    tilted_mean: tuple
    tilted_var: tuple
    valid: tuple  # cavity proper and tilted moments finite
    proper: jax.Array  # q proper and every cavity proper
    magnitude: jax.Array  # |log Z_q| + Σ|log normaliser of each anchor|/η: the size of value's terms


def _quadratics(sites: SiteParams):
    """The sites as the (a, A, c) quadratics of the shared Gaussian integral."""
    return tuple((nu, tau, 0.0) for tau, nu in zip(sites.precision, sites.shift))


def _direction(ev: _Evaluation, power) -> SiteParams:
    """(λ̂ − λ_q)/η for every valid site: the undamped EP step, in natural parameters."""
    dtau, dnu = [], []
    for m, V, m_hat, V_hat, ok in zip(ev.marginal_mean, ev.marginal_var, ev.tilted_mean, ev.tilted_var, ev.valid):
        V_hat = jnp.where(ok, V_hat, 1.0)
        step_tau, step_nu = site_step(m, V, m_hat, V_hat, power)
        dtau.append(jnp.where(ok, step_tau, 0.0))
        dnu.append(jnp.where(ok, step_nu, 0.0))
    return SiteParams(tuple(dtau), tuple(dnu))


def _placeholder(fn, *args):
    """NaN-filled arrays (False for booleans) of the shapes ``fn(*args)`` returns, without running it."""
    fill = lambda a: jnp.full(a.shape, False if a.dtype == bool else jnp.nan, a.dtype)
    return jax.tree_util.tree_map(fill, jax.eval_shape(fn, *args))


def _residual(ev: _Evaluation):
    """max_n |m̂_n − m_n|/√V_n + |log(V̂_n/V_n)| over valid sites: 0 exactly at a fixed point."""
    worst = jnp.zeros((), ev.value.dtype)
    for m, V, m_hat, V_hat, ok in zip(ev.marginal_mean, ev.marginal_var, ev.tilted_mean, ev.tilted_var, ev.valid):
        r = moment_residual(m, V, m_hat, jnp.where(ok, V_hat, 1.0))
        worst = jnp.maximum(worst, jnp.max(jnp.where(ok, r, 0.0), initial=0.0))
    return jnp.where(ev.proper, worst, jnp.inf)


def cavity(mean, var, tau, nu, power=1.0):
    """The cavity N(m₋, V₋) ∝ N(x | mean, var) · t̃(x)^{−η} of a site t̃(x) = exp(νx − ½τx²).

    Returns ``(m₋, V₋, proper)`` (inputs broadcast); where 1/V₋ = 1/var − ητ ≤ 0, V₋ = 1 and ``proper`` is False."""
    precision = 1.0 / var - power * tau
    proper = precision > 0
    cavity_var = 1.0 / jnp.where(proper, precision, 1.0)
    return (mean / var - power * nu) * cavity_var, cavity_var, proper


def site_step(mean, var, tilted_mean, tilted_var, power=1.0):
    """The undamped EP step of a site, (Δτ, Δν) = ((1/V̂ − 1/V)/η, (m̂/V̂ − m/V)/η) (Jylänki eqs. 2.36–2.37)."""
    return (1.0 / tilted_var - 1.0 / var) / power, (tilted_mean / tilted_var - mean / var) / power


def moment_residual(mean, var, tilted_mean, tilted_var):
    """|m̂ − m|/√V + |log(V̂/V)|: the distance of the tilted moments from q's marginal, 0 at a fixed point."""
    return jnp.abs(tilted_mean - mean) / jnp.sqrt(var) + jnp.abs(jnp.log(tilted_var / var))


def _check_settings(method):
    """Refuse an EP method's `damping` or `power` outside (0, 1], `max_iter` < 1 or `tol` ≤ 0 (where concrete)."""
    name = type(method).__name__
    for field in ("damping", "power"):
        x = getattr(method, field)
        if x is not None and _checks.is_concrete(x) and not (0 < x <= 1):
            raise ValueError(f"{name}: `{field}` must lie in (0, 1], got {x!r}.")
    _checks.integer("max_iter", method.max_iter, name)
    if _checks.is_concrete(method.tol) and not method.tol > 0:
        raise ValueError(f"{name}: `tol` must be positive, got {method.tol!r}.")


def _num_invalid(ev: _Evaluation):
    return sum(jnp.sum(~ok) for ok in ev.valid)


def _change(step: SiteParams, ev: _Evaluation):
    """max over sites of |Δτ|·V and |Δν|·√V (a site change in units of its marginal)."""
    worst = jnp.zeros((), ev.value.dtype)
    for dtau, dnu, V in zip(step.precision, step.shift, ev.marginal_var):
        worst = jnp.maximum(worst, jnp.max(jnp.maximum(jnp.abs(dtau) * V, jnp.abs(dnu) * jnp.sqrt(V)), initial=0.0))
    return worst
