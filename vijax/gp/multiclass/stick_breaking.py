"""Multi-class GP classification with the stick-breaking logistic likelihood (Khan thesis §5.6).

C classes, K = C − 1 stick functions η_j ~ GP(0, k), independent, broken off in the order of a
permutation of the classes (``ordering``; class ``ordering[k]`` is at position k):

$$
p(y = k \\mid \\eta) = \\sigma(\\eta_k) \\prod_{j < k} (1 - \\sigma(\\eta_j)),\\ k < K, \\qquad
p(y = K \\mid \\eta) = \\prod_{j < K} (1 - \\sigma(\\eta_j)),
$$

so log p(y = k | η) = Σ_{j ≤ k} log σ(±η_j): one binary logistic site per (stick j, input n) with
j ≤ rank(y_n); the other stick values are integrated out, leaving a `LatentLinearModel` with H = diag(±1).
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import block_diag

from ...model import DenseGaussian, GaussianFactor, LatentLinearModel, ScaledIdentity, Sites
from ...potentials import Logistic, PiecewiseLogistic
from ...quadrature import GaussHermite, safe_sqrt
from .._layout import class_labels
from ... import _checks
from ..kernels import AbstractKernel
from ..models import DEFAULT_JITTER, conditional_marginals

__all__ = ["StickBreakingModel", "StickLayout", "stick_breaking_model", "stick_breaking_probabilities",
           "stick_breaking_predict", "stick_breaking_proba"]
__dir__ = __all__.copy


class StickLayout(NamedTuple):
    """Where each latent coordinate of a `StickBreakingModel` sits (NumPy arrays, D latent values)."""

    rank: np.ndarray  # position of each input's class in the ordering, (N,)
    ordering: np.ndarray  # class at each position, (C,)
    stick: np.ndarray  # stick of each latent coordinate, (D,)
    point: np.ndarray  # input of each latent coordinate, (D,)
    sign: np.ndarray  # +1 where the input's class is this stick's, −1 where it comes later, (D,)


def _layout(labels, n, num_classes, ordering, owner) -> StickLayout:
    y = class_labels(labels, n, num_classes, owner)
    order = np.arange(num_classes) if ordering is None else np.asarray(ordering)
    if order.shape != (num_classes,) or sorted(order.tolist()) != list(range(num_classes)):
        raise ValueError(f"{owner}: `ordering` must be a permutation of 0 … {num_classes - 1} (the class "
                         f"broken off by each stick in turn), got {ordering!r}.")
    rank = np.argsort(order)[y]
    stick, point = np.nonzero(rank >= np.arange(num_classes - 1)[:, None])  # stick by stick, the inputs reaching it
    sign = np.where(rank[point] == stick, 1.0, -1.0)
    return StickLayout(rank, order, stick, point, sign)


class StickBreakingModel(LatentLinearModel):
    """The stick-breaking logistic GP classifier: a `vj.LatentLinearModel` whose latent w (D values) holds,
    stick by stick, η_j at the inputs whose class is at position ≥ j of ``ordering``: prior
    N(0, blkdiag(K_j + jitter·I)), sites log σ(±η_j(x_n)).

    **Arguments:**

    - `kernel` (shared by the sticks), `X` ``(N, d)``, `labels` (0 … C − 1, ``(N,)``), `num_classes` C ≥ 2.
    - `pieces`: R for `vj.potentials.PiecewiseLogistic(R)` sites (with `vj.GKL`, ``log_z`` a lower bound),
      or None for exact `Logistic` sites.
    - `ordering`: the class broken off by each stick in turn (a permutation of 0 … C − 1; default in order).
    - `jitter`: added to the diagonal of each block.

    **Fields** besides `prior` and `sites`: `kernel`, `X` and the static `labels`, `num_classes`, `ordering`.
    """

    kernel: AbstractKernel
    X: jax.Array
    labels: tuple[int, ...] = eqx.field(static=True)
    num_classes: int = eqx.field(static=True)
    ordering: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, kernel, X, labels, num_classes, pieces=20, ordering=None, jitter=DEFAULT_JITTER):
        owner = "vj.gp.multiclass.stick_breaking_model"
        if not isinstance(kernel, AbstractKernel):
            raise ValueError(f"{owner}: `kernel` must be a vj.gp.kernels kernel, got {type(kernel).__name__}.")
        X = _checks.as_inputs(X, owner)
        layout = _layout(labels, X.shape[0], num_classes, ordering, owner)
        Kx = kernel(X)
        blocks = [Kx[np.ix_(layout.point[layout.stick == j], layout.point[layout.stick == j])]
                  for j in range(num_classes - 1)]
        prior = GaussianFactor.dense(jnp.zeros(layout.point.size, Kx.dtype), block_diag(*blocks), jitter=jitter)
        potential = Logistic() if pieces is None else PiecewiseLogistic(pieces)
        super().__init__(prior, Sites(ScaledIdentity(jnp.asarray(layout.sign, Kx.dtype)), potential))
        self.kernel = kernel
        self.X = X
        self.labels = tuple(int(c) for c in layout.ordering[layout.rank])
        self.num_classes = int(num_classes)
        self.ordering = tuple(int(c) for c in layout.ordering)

    @property
    def layout(self) -> StickLayout:
        """The stick, input and sign of each latent coordinate (from the recorded labels and ordering)."""
        return _layout(np.asarray(self.labels), len(self.labels), self.num_classes, self.ordering,
                       "StickBreakingModel.layout")


def stick_breaking_model(kernel, X, labels, num_classes, pieces=20, ordering=None,
                         jitter=DEFAULT_JITTER) -> StickBreakingModel:
    """The stick-breaking logistic GP classifier: ``StickBreakingModel(...)``, whose arguments these are."""
    return StickBreakingModel(kernel, X, labels, num_classes, pieces, ordering, jitter)


def stick_breaking_probabilities(eta):
    """p(y = c | η) for stick values ``eta`` ``(..., C − 1)``: shape ``(..., C)`` in stick order."""
    eta = jnp.asarray(eta)
    log_keep = jnp.cumsum(jax.nn.log_sigmoid(-eta), axis=-1)  # log ∏_{j≤k} (1 − σ(η_j))
    before = jnp.concatenate([jnp.zeros_like(eta[..., :1]), log_keep[..., :-1]], axis=-1)
    return jnp.concatenate([jnp.exp(jax.nn.log_sigmoid(eta) + before), jnp.exp(log_keep[..., -1:])], axis=-1)


def stick_breaking_predict(post, X_test):
    """Predictive means and variances of the stick functions at ``X_test`` ``(T, d)``: two arrays ``(T, C − 1)``.

    ``post`` is any fit of a `stick_breaking_model`; per stick, as `vj.gp.predict`."""
    return _predict(post, X_test, "vj.gp.multiclass.stick_breaking_predict")[:2]


def _predict(post, X_test, owner):
    """The sticks' predictive means and variances, and the layout of ``post.model``."""
    model = getattr(post, "model", None)
    if not isinstance(model, StickBreakingModel):
        raise ValueError(f"{owner}: `post` must be a fit of vj.gp.multiclass.stick_breaking_model (its model records "
                         f"the layout), got {'a fit of ' + type(model).__name__ if model is not None else type(post).__name__}.")
    kernel, X, layout, prior = model.kernel, model.X, model.layout, model.prior
    X_test = _checks.as_inputs(X_test, owner)
    if not isinstance(prior, DenseGaussian) or prior.dim != layout.point.size:
        raise ValueError(f"{owner}: `post` is not a fit of stick_breaking_model with these labels "
                         f"({layout.point.size} latent values expected).")
    prior_diag = kernel.diagonal(X_test)
    means, variances = [], []
    for j in range(len(layout.ordering) - 1):
        idx = np.flatnonzero(layout.stick == j)
        chol = prior.chol[np.ix_(idx, idx)]  # the Cholesky factor of a block-diagonal matrix is blockwise
        mean, var = conditional_marginals(post, chol, kernel(X[layout.point[idx]], X_test), prior_diag, idx)
        means.append(mean)
        variances.append(var)
    return jnp.stack(means, -1), jnp.stack(variances, -1), layout


def stick_breaking_proba(post, X_test, quadrature=GaussHermite(64)):
    """Class probabilities ``(T, C)`` (columns in class order, rows summing to one) at ``X_test`` ``(T, d)``.

    p(y_* = k) = ⟨σ(η_k)⟩ ∏_{j<k} ⟨1 − σ(η_j)⟩, each ⟨·⟩ by ``quadrature`` under the stick's predictive marginal
    (the sticks independent a posteriori, as for the exact posterior)."""
    owner = "vj.gp.multiclass.stick_breaking_proba"
    mean, var, layout = _predict(post, X_test, owner)
    a = quadrature.expect(jax.nn.sigmoid, mean, safe_sqrt(var))  # ⟨σ(η_j)⟩, (T, K)
    log_keep = jnp.cumsum(jnp.log1p(-a), axis=-1)
    before = jnp.concatenate([jnp.zeros_like(a[:, :1]), log_keep[:, :-1]], axis=-1)
    in_stick_order = jnp.concatenate([a * jnp.exp(before), jnp.exp(log_keep[:, -1:])], axis=-1)
    return in_stick_order[:, np.argsort(layout.ordering)]
