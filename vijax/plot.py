"""Plots of fits: coefficient intervals, GP predictive bands, convergence traces, method comparison.

Needs matplotlib (``pip install "vijax[plot]"``); ``vj.plot`` loads this module on first access. Every
helper draws on ``ax`` (a new figure's axes when None) and returns the axes, so panels compose::

    fig, (a, b) = plt.subplots(1, 2)
    vj.plot.coefficients({"G-KL": post, "Laplace": lap}, ax=a)
    vj.plot.convergence({"G-KL": post}, ax=b)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import gp

__all__ = ["coefficients", "gp_bands", "convergence", "compare"]
__dir__ = __all__.copy


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4))[1]


def _labelled(items, default="fit"):
    """A mapping label -> item from one item or a mapping."""
    return dict(items) if isinstance(items, Mapping) else {default: items}


def coefficients(posteriors: Any, names: Sequence[str] | None = None, ax: Any = None, width: float = 2.0) -> Any:
    """Posterior means with ± ``width`` marginal standard deviations, one marker per coefficient.

    Args:
        posteriors: a `vj.Posterior`, or a mapping label -> posterior (drawn side by side).
        names: coefficient names for the x axis (default: their indices).
        ax: matplotlib axes to draw on (default: a new figure).
        width: the half-width of each interval in standard deviations (2 ≈ a 95% interval).
    """
    ax = _axes(ax)
    fits = _labelled(posteriors)
    offsets = np.linspace(-0.2, 0.2, len(fits)) if len(fits) > 1 else [0.0]
    for (label, post), offset in zip(fits.items(), offsets):
        mean, sd = np.asarray(post.mean), np.asarray(post.std)
        ax.errorbar(np.arange(mean.shape[0]) + offset, mean, yerr=width * sd, fmt="o", ms=3, capsize=2, lw=1,
                    label=label)
    ax.axhline(0.0, color="0.7", lw=0.8, zorder=0)
    if names is not None:
        ax.set_xticks(np.arange(len(names)), names, rotation=90, fontsize=7)
    ax.set(xlabel="coefficient", ylabel=f"posterior mean ± {width:g} sd")
    if len(fits) > 1:
        ax.legend(fontsize=8)
    return ax


def gp_bands(post: Any, X_test: Any, X: Any = None, y: Any = None, ax: Any = None, width: float = 2.0,
             label: str = "posterior mean") -> Any:
    """The latent predictive mean of a GP fit over 1-D inputs with a ± ``width`` sd band.

    Args:
        post: a posterior of a `vj.gp.model` with one input dimension.
        X_test: test inputs, shape ``(T,)`` or ``(T, 1)``, e.g. a grid.
        X: training inputs to scatter with ``y``, if given.
        y: training targets (or labels) at ``X``.
        ax: matplotlib axes (default: a new figure).
        width: the band's half-width in standard deviations of f.
        label: the legend label of the mean.
    """
    ax = _axes(ax)
    X_test = np.asarray(X_test, dtype=float).reshape(-1, 1)
    mean, var = gp.predict(post, X_test)
    grid, mean, sd = X_test[:, 0], np.asarray(mean), np.sqrt(np.asarray(var))
    order = np.argsort(grid)
    grid, mean, sd = grid[order], mean[order], sd[order]
    (line,) = ax.plot(grid, mean, lw=1.5, label=label)
    ax.fill_between(grid, mean - width * sd, mean + width * sd, color=line.get_color(), alpha=0.2,
                    label=f"± {width:g} sd")
    if X is not None and y is not None:
        ax.scatter(np.asarray(X, dtype=float).reshape(-1), np.asarray(y), s=8, color="k", alpha=0.6, label="data")
    ax.set(xlabel="x", ylabel="f(x)")
    ax.legend(fontsize=8)
    return ax


def convergence(posteriors: Any, ax: Any = None, gap: bool = False) -> Any:
    """The objective per iteration (``diagnostics.objective_trace``) of one or several fits.

    Args:
        posteriors: a fit with ``diagnostics`` (a `vj.Posterior`, an ML-II or factor fit), or a mapping of them.
        ax: matplotlib axes (default: a new figure).
        gap: plot final value − value on a log scale (how fast each fit reaches its own optimum).
    """
    ax = _axes(ax)
    for label, fit in _labelled(posteriors).items():
        trace = np.asarray(fit.diagnostics.objective_trace, dtype=float)
        trace = trace[np.isfinite(trace)]
        steps = np.arange(trace.shape[0])
        if gap:
            ax.semilogy(steps[:-1], np.maximum(trace[-1] - trace[:-1], 1e-16), marker=".", label=label)
        else:
            ax.plot(steps, trace, marker=".", label=label)
    ax.set(xlabel="iteration", ylabel="final − objective" if gap else "objective")
    ax.legend(fontsize=8)
    return ax


def compare(results: Mapping[str, Any], ax: Any = None, xlabel: str = "log Z") -> Any:
    """A horizontal bar per method: ``log_z`` of posteriors, or any number per label.

    Bounds (``is_lower_bound``) are solid, approximations hatched: only bounds order methods by closeness.

    Args:
        results: a mapping label -> `vj.Posterior` (its ``log_z``) or label -> number.
        ax: matplotlib axes (default: a new figure).
        xlabel: the quantity's name.
    """
    ax = _axes(ax)
    values = np.asarray([float(r.log_z) if hasattr(r, "log_z") else float(r) for r in results.values()])
    bounds = [bool(getattr(r, "is_lower_bound", True)) for r in results.values()]
    left = np.nanmin(values) - 0.05 * (np.ptp(values[np.isfinite(values)]) + 1.0) if np.isfinite(values).any() else 0
    y = np.arange(len(results))
    bars = ax.barh(y, values - left, left=left, color="C0")
    for bar, bound in zip(bars, bounds):
        if not bound:
            bar.set(hatch="//", facecolor="white", edgecolor="C1")
    for yi, v in zip(y, values):
        ax.text(v, yi, f" {v:.4g}", va="center", fontsize=8)
    ax.set_yticks(y, list(results))
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    return ax
