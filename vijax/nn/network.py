"""Bayesian two-layer networks with hierarchical input-weight priors, fitted by EP (Jylänki 2013, Publication IV).

$$
f(x) = \\sum_{k=1}^K v_k\\, g(w_k^\\top \\tilde x) + v_0, \\quad y_i \\sim \\mathcal N(f(x_i), e^{φ_0}), \\quad
w_{kj} \\mid φ \\sim \\mathcal N(0, e^{φ_{l_j}}), \\quad φ_l \\sim \\mathcal N(μ_{0,l}, σ^2_{0,l}), \\quad
v_k \\sim \\mathcal N(0, σ_v^2)\\,[v_k \\ge 0]\\ (k \\ge 1), \\quad v_0 \\sim \\mathcal N(0, σ_v^2), \\quad
φ_0 \\sim \\mathcal N(\\text{noise prior}).
$$

x̃ = [x, 1], g(a) = erf(a/√2). q(v) ∏_k q(w_k) q(φ) is Gaussian and factorised (thesis §3.3), with a rank-one
site on v per point, sites on each activation h_ik = w_kᵀx̃_i and on φ_0, `HierarchicalEP`'s prior sites per
weight and positivity sites on v_k. Predictive intervals err wide (the factorised q fits the data less closely).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, log_ndtr, logsumexp

from .. import _checks
from .._factorisation import Primal
from .._linalg import LOG_2PI, backtrack, normal_log_density, select
from ..covariance import CholeskyFactor
from ..methods import AbstractMethod
from ..methods.ep import cavity, moment_residual, site_step
from ..methods.ep_hyper import log_variance_tilted_moments
from ..posterior import Diagnostics, Posterior
from ..quadrature import GaussHermite
from ..solvers import LBFGS, Status, iterate

__all__ = ["TwoLayerNetwork", "NetworkEP", "NetworkPosterior", "NetworkState", "NetworkSites", "NetworkInfo",
           "activation", "expected_activation", "map_estimate"]
__dir__ = __all__.copy

_SQRT2 = float(np.sqrt(2.0))
_MAX_HALVINGS = 30
_MOMENTUM_AFTER = 200  # plain damped iterations before the momentum starts (`NetworkEP`, "momentum")
_PRIOR_DAMPING_AFTER = 1000  # iterations before the prior and scale sites take `prior_damping`


def activation(a):
    """g(a) = erf(a/√2), the network's hidden unit."""
    return erf(a / _SQRT2)


def expected_activation(mean, var):
    """E g(a) under N(a | mean, var), in closed form: erf(mean/√(2(1 + var)))."""
    return erf(mean / jnp.sqrt(2.0 * (1.0 + var)))


class TwoLayerNetwork(eqx.Module):
    """The data and priors of a two-layer network regression (module docstring).

    **Arguments:**

    - `X` ``(n, d)``, `y` ``(n,)``: standardised data (the default priors are on the unit scale).
    - `num_hidden`: K. `groups`: ``"ard"`` (one scale per input), ``"common"``, or int labels ``(d,)``
      0..G−1; the input bias has its own group (the last).
    - `scale_prior`, `noise_prior`: (mean, variance) of each φ_l and of φ_0 = log σ² (a tight one holds a known σ²).
    - `output_variance`: σ_v², the prior variance of the output weights and bias.
    """

    X: jax.Array  # (n, d + 1), with the bias column
    y: jax.Array
    labels: jax.Array  # (d + 1,) group of each input (the bias last)
    hyper_mean: jax.Array  # (1 + G + 1,): noise, input groups, bias group
    hyper_var: jax.Array
    output_variance: jax.Array
    num_hidden: int = eqx.field(static=True)

    def __init__(self, X, y, num_hidden=8, groups="ard", scale_prior=(0.0, 4.0), noise_prior=(-2.0, 4.0),
                 output_variance=1.0):
        owner = "TwoLayerNetwork"
        X = _checks.as_float_array("X", X, owner, ndim=2)
        y = _checks.as_float_array("y", y, owner, ndim=1)
        _checks.check_finite("X", X, owner)
        _checks.check_finite("y", y, owner)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"{owner}: X has {X.shape[0]} rows but y has {y.shape[0]} entries.")
        num_hidden = _checks.integer("num_hidden", num_hidden, owner)
        d = X.shape[1]
        if isinstance(groups, str):
            if groups not in ("ard", "common"):
                raise ValueError(f"{owner}: `groups` must be 'ard', 'common' or an int array ({d},); got {groups!r}.")
            labels = np.arange(d) if groups == "ard" else np.zeros(d, int)
        else:
            labels = np.asarray(groups)
            if labels.shape != (d,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 \
                    or set(np.unique(labels).tolist()) != set(range(labels.max() + 1)):
                raise ValueError(f"{owner}: `groups` as an array must hold d = {d} group labels 0..G-1, each used.")
        G = int(labels.max()) + 1
        _checks.check_positive("output_variance", output_variance, owner)
        dtype = X.dtype
        self.X = jnp.concatenate([X, jnp.ones((X.shape[0], 1), dtype)], 1)
        self.y = y.astype(dtype)
        self.labels = jnp.asarray(np.r_[labels, G])
        s_mean, s_var = (jnp.broadcast_to(jnp.asarray(a, dtype), (G,)) for a in scale_prior)
        # The bias group: the same hyperprior as the inputs' (a separate scale, not a separate prior).
        self.hyper_mean = jnp.concatenate([jnp.asarray([noise_prior[0]], dtype), s_mean, s_mean[:1]])
        self.hyper_var = jnp.concatenate([jnp.asarray([noise_prior[1]], dtype), s_var, s_var[:1]])
        _checks.check_positive("hyper_var", self.hyper_var, owner)
        self.output_variance = jnp.asarray(output_variance, dtype)
        self.num_hidden = num_hidden

    @property
    def num_inputs(self) -> int:
        return self.X.shape[1] - 1


class NetworkSites(NamedTuple):
    """The site parameters of `NetworkEP` (natural parameters), one entry per kind of site."""

    h_tau: jax.Array  # (n, K): likelihood sites on the activations
    h_nu: jax.Array
    v_tau: jax.Array  # (n,): likelihood sites on v, rank one: exp(−τ_i (u_iᵀv)²/2 + ν_i u_iᵀv)
    v_nu: jax.Array
    v_dir: jax.Array  # (n, K+1): their directions u_i (ḡ_i at the fixed point)
    noise_tau: jax.Array  # (n,): likelihood sites on φ_0
    noise_nu: jax.Array
    w_tau: jax.Array  # (K, d+1): input-weight prior sites on w_kj
    w_nu: jax.Array
    scale_tau: jax.Array  # (K, d+1): their sites on φ_{l_j}
    scale_nu: jax.Array
    pos_tau: jax.Array  # (K,): positivity sites on v_1..v_K
    pos_nu: jax.Array

    def add(self, other, alpha):
        return NetworkSites(*(a + alpha * b for a, b in zip(self, other)))


class _Q(NamedTuple):
    w_mean: jax.Array  # (K, d+1)
    w_precision: Primal  # the factorised precisions of q(w_k), one per hidden unit (leading axis K)
    v_mean: jax.Array  # (K+1,)
    v_cov: jax.Array
    v_prec: jax.Array
    v_shift: jax.Array
    phi_mean: jax.Array  # (L,)
    phi_var: jax.Array
    proper: jax.Array


class _Eval(NamedTuple):
    q: _Q
    step: NetworkSites  # the undamped EP step of every site
    residual: jax.Array
    proper: jax.Array
    residuals: jax.Array  # per kind of site: activations, noise, weights, scales, positivity, outputs


def _per_unit(fn, *xs):
    """``fn`` over the hidden units by `jax.lax.map`: a `vmap` can deadlock two batched LAPACK calls on CPU."""
    return jax.lax.map(lambda args: fn(*args), xs)


def _q(net: TwoLayerNetwork, s: NetworkSites) -> _Q:
    K = net.num_hidden
    X = net.X
    # q(w_k): precision Xᵀ diag(τ_{·k}) X + diag(τ^w_k), one Cholesky per hidden unit.
    P = jnp.einsum("nk,ni,nj->kij", s.h_tau, X, X) + jax.vmap(jnp.diag)(s.w_tau)
    r = s.h_nu.T @ X + s.w_nu
    factors = _per_unit(Primal.of, P)
    w_mean = _per_unit(lambda f, r_: f.solve(r_), factors, r)
    # q(v): the prior N(0, σ_v² I), the likelihood sites, the positivity sites.
    pos = jnp.concatenate([s.pos_tau, jnp.zeros(1, s.pos_tau.dtype)])
    v_prec = jnp.eye(K + 1, dtype=X.dtype) / net.output_variance + (s.v_dir * s.v_tau[:, None]).T @ s.v_dir \
        + jnp.diag(pos)
    v_shift = s.v_nu @ s.v_dir + jnp.concatenate([s.pos_nu, jnp.zeros(1, s.pos_nu.dtype)])
    v_prec = 0.5 * (v_prec + v_prec.T)
    v_factor = Primal.of(v_prec)
    v_cov = v_factor.solve(jnp.eye(K + 1, dtype=X.dtype))
    v_mean = v_cov @ v_shift
    # q(φ): noise (index 0) and the input groups.
    Lh = net.hyper_mean.shape[0]
    tau = jnp.zeros(Lh, X.dtype).at[0].add(jnp.sum(s.noise_tau)) + jax.ops.segment_sum(jnp.sum(s.scale_tau, 0), net.labels + 1, Lh)
    nu = jnp.zeros(Lh, X.dtype).at[0].add(jnp.sum(s.noise_nu)) + jax.ops.segment_sum(jnp.sum(s.scale_nu, 0), net.labels + 1, Lh)
    precision = 1.0 / net.hyper_var + tau
    phi_ok = jnp.all(precision > 0)
    phi_var = 1.0 / jnp.where(precision > 0, precision, 1.0)
    phi_mean = (net.hyper_mean / net.hyper_var + nu) * phi_var
    proper = jnp.all(jnp.isfinite(factors.R)) & jnp.all(jnp.isfinite(v_factor.R)) & phi_ok
    return _Q(w_mean, factors, v_mean, v_cov, v_prec, v_shift, phi_mean, phi_var, proper)


def _activation_marginals(q: _Q, X):
    """Means and variances (n, K) of h_ik = w_kᵀx̃_i under q, and the variances (K, d+1) of w_kj."""
    means = X @ q.w_mean.T
    # x̃_iᵀ P_k⁻¹ x̃_i and e_jᵀ P_k⁻¹ e_j, each a ‖`half_solve`‖²: one triangular solve for both.
    rhs = jnp.concatenate([X.T, jnp.eye(X.shape[1], dtype=X.dtype)], axis=1)  # (d+1, n + d+1)
    Z = _per_unit(lambda f: f.half_solve(rhs), q.w_precision)  # (K, d+1, n+d+1)
    squares = jnp.sum(Z**2, 1)
    variances, w_var = squares[:, : X.shape[0]].T, squares[:, X.shape[0]:]
    return means, variances, w_var


def map_estimate(net: TwoLayerNetwork, w0, iterations: int = 500):
    """Input weights ``(K, d+1)`` and output weights ``(K+1,)`` maximising the log joint at φ = its prior mean.

    By `iterations` of L-BFGS from input weights `w0` and output weights 1/2 (v_1..v_K = softplus(u) ≥ 0). φ_0
    is not learnt: the MAP network would interpolate the data and EP there stall."""
    K, D = w0.shape
    dtype = net.X.dtype
    w_var = jnp.exp(net.hyper_mean[1 + net.labels])
    to_v = lambda u: jnp.concatenate([jax.nn.softplus(u[:K]), u[K:]])
    noise = jnp.exp(net.hyper_mean[0])

    def log_joint(x):
        W, u = x[: K * D].reshape(K, D), x[K * D:]
        v = to_v(u)
        f = activation(net.X @ W.T) @ v[:K] + v[K]
        return -0.5 * (jnp.sum((net.y - f) ** 2) / noise + jnp.sum(W**2 / w_var) + jnp.sum(v**2) / net.output_variance)

    u0 = jnp.concatenate([jnp.full(K, 0.4328, dtype), jnp.zeros(1, dtype)])  # softplus(0.4328) = 0.5
    x = LBFGS(max_iter=iterations).maximise(log_joint, jnp.concatenate([w0.reshape(-1), u0])).x
    return x[: K * D].reshape(K, D), to_v(x[K * D:])


class NetworkState(eqx.Module):
    """The State of `NetworkEP`: the sites and the iterations run (a refit continues the damping schedule)."""

    sites: NetworkSites
    iteration: jax.Array


class NetworkInfo(eqx.Module):
    """What `NetworkEP` reports in ``post.diagnostics.info``: the final moment residuals ``(6,)`` of the
    activation, noise, weight prior, scale, positivity and output sites; the residual after each iteration
    (`residual_trace`, NaN-padded); the iterations whose step was halved to keep q proper (`shrunk`)."""

    residuals: jax.Array
    residual_trace: jax.Array
    shrunk: jax.Array


class NetworkPosterior(Posterior):
    """q(v) ∏ q(w_k) q(φ) of a `TwoLayerNetwork` fitted by `NetworkEP`: a `vj.Posterior` of the weights.

    - `w_mean` ``(K, d+1)``, `w_cov` ``(K, d+1, d+1)``: q(w_k), the bias last; `v_mean` ``(K+1,)``, `v_cov`:
      q(v), v_0 last; `hyper_mean`, `hyper_var` ``(L,)``: q(φ), log σ² first, then the groups, then the bias.
    - `mean`, `factor`: q(θ), θ = [w_1; …; w_K; v] (a dense block-diagonal factor); `log_z`: NaN (the tilted
      moments derive from no tilted normaliser); `diagnostics` with a `NetworkInfo`; `state` a `NetworkState`.
    """

    w_mean: jax.Array
    w_cov: jax.Array
    v_mean: jax.Array
    v_cov: jax.Array
    hyper_mean: jax.Array
    hyper_var: jax.Array
    quadrature: GaussHermite = eqx.field(static=True, default=GaussHermite(32))
    defines_log_z: ClassVar[bool] = False

    def __init__(self, w_mean, w_cov, v_mean, v_cov, hyper_mean, hyper_var, diagnostics, model, state):
        blocks = _per_unit(lambda S: jnp.linalg.cholesky(S).T, w_cov)  # upper C_k with S_k = C_kᵀC_k
        C = jax.scipy.linalg.block_diag(*blocks, jnp.linalg.cholesky(v_cov).T)
        mean = jnp.concatenate([w_mean.reshape(-1), v_mean])
        super().__init__(mean, CholeskyFactor.from_matrix(C), jnp.full((), jnp.nan, mean.dtype), diagnostics, model,
                         bound_claim=False, state=state)
        self.w_mean, self.w_cov, self.v_mean, self.v_cov = w_mean, w_cov, v_mean, v_cov
        self.hyper_mean, self.hyper_var = hyper_mean, hyper_var

    def noise_variance(self):
        """E_q[σ²] = exp(μ_0 + s_0²/2)."""
        return jnp.exp(self.hyper_mean[0] + 0.5 * self.hyper_var[0])

    def relevances(self):
        """E_q[e^{φ_l}] for the input groups, ``(G,)`` (small for irrelevant inputs)."""
        return jnp.exp(self.hyper_mean[1:-1] + 0.5 * self.hyper_var[1:-1])

    def predict(self, X_test):
        """Predictive ``(mean, variance)`` of y_*, ``(N,)`` each: f_*'s exact moments under q, plus E[σ²]."""
        mean, var_f = self._f(X_test)
        return mean, var_f + self.noise_variance()

    def log_predictive(self, X_test, y_test):
        """log p(y_* | data) ≈ log ∫ N(y_* | E f_*, Var f_* + e^{φ_0}) q(φ_0) dφ_0 (f_* taken Gaussian)."""
        mean, var_f = self._f(X_test)
        y_test = jnp.asarray(y_test, mean.dtype)
        log_density = lambda phi: normal_log_density(y_test, mean, var_f + jnp.exp(phi))
        ones = jnp.ones_like(mean)
        return self.quadrature.log_expect_exp(log_density, self.hyper_mean[0] * ones,
                                              jnp.sqrt(self.hyper_var[0]) * ones)

    def _f(self, X_test):
        X_test = jnp.asarray(X_test, self.w_mean.dtype)
        Xb = jnp.concatenate([X_test, jnp.ones((X_test.shape[0], 1), X_test.dtype)], 1)
        m = Xb @ self.w_mean.T
        V = jnp.einsum("ni,kij,nj->nk", Xb, self.w_cov, Xb)
        g_mean = expected_activation(m, V)
        g_sq = self.quadrature.expect(lambda a: activation(a) ** 2, m, jnp.sqrt(V))
        g_var = jnp.maximum(g_sq - g_mean**2, 0.0)
        g_mean = jnp.concatenate([g_mean, jnp.ones_like(g_mean[:, :1])], -1)
        g_var = jnp.concatenate([g_var, jnp.zeros_like(g_var[:, :1])], -1)
        # f = vᵀg̃, v independent of g̃ (independent coordinates): Var f = ḡᵀΣḡ + Σ_k (Σ_kk + m_k²) Var g̃_k.
        a = jnp.einsum("ij,nj->ni", self.v_cov, g_mean)
        var = jnp.sum(g_mean * a, -1) + jnp.sum((jnp.diagonal(self.v_cov) + self.v_mean**2) * g_var, -1)
        return jnp.sum(self.v_mean * g_mean, -1), var


class NetworkEP(AbstractMethod):
    """Parallel EP for `TwoLayerNetwork`: all sites move together, damped, the step halved until q and every
    cavity are proper.

    **Arguments:**

    - `damping`: δ ∈ (0, 1], the fraction of each EP step taken (default 0.3: parallel updates need more).
    - `prior_damping`: the prior and scale sites' damping from iteration 1000 on (default 0.6; None:
      ``damping``), a rescue for slow runs after the early iterations have chosen which units live.
    - `momentum`: β ∈ [0, 1): each move is δ·(EP step) + β·(previous move) from iteration 200 on, restarted
      when the residual rises (default 0.7; 0: plain EP): it carries q along a slow ridge.
    - `max_iter`, `tol`: converged when the moment residual, max over sites of |m̂ − m|/√V + |log V̂/V|,
      is ≤ ``tol`` (defaults 2000 and 1e-3).
    - `activation_nodes`, `noise_nodes`: Gauss–Hermite nodes over each activation and over φ_0.
    - `init`: ``"map"`` (default): sites at `map_estimate`'s weights from N(0, 1/d) ones drawn with `key`;
      ``"random"``: at the random weights, q(v) the prior (parallel EP then kills most units).
    - `init_precision`, `init_output_precision`: the starting activation sites' precision and the starting v
      sites' total precision (``"map"``).
    - `nonnegative_activation_sites`: cap each activation's tilted variance at its cavity's (default True:
      otherwise a unit's sites on w_k oscillate).
    - `key`: the key of the random start weights (None: ``jax.random.PRNGKey(0)``).
    """

    damping: float = 0.3
    prior_damping: float | None = 0.6
    momentum: float = 0.7
    max_iter: int = eqx.field(static=True, default=2000)
    tol: float = 1e-3
    activation_nodes: int = eqx.field(static=True, default=32)
    noise_nodes: int = eqx.field(static=True, default=10)
    init: str = eqx.field(static=True, default="map")
    init_precision: float = 1.0
    init_output_precision: float = 10.0
    nonnegative_activation_sites: bool = eqx.field(static=True, default=True)
    key: jax.Array | None = None

    def __check_init__(self):
        for name, valid, rule in (("damping", lambda x: 0 < x <= 1, "lie in (0, 1]"),
                                  ("prior_damping", lambda x: x is None or 0 < x <= 1, "be None or lie in (0, 1]"),
                                  ("momentum", lambda x: 0 <= x < 1, "lie in [0, 1)"),
                                  ("tol", lambda x: x >= 0, "be non-negative")):
            value = getattr(self, name)
            if _checks.is_concrete(value) and not valid(value):
                raise ValueError(f"NetworkEP: `{name}` must {rule}, got {value!r}.")
        _checks.integer("max_iter", self.max_iter, "NetworkEP")
        if self.init not in ("map", "random"):
            raise ValueError(f"NetworkEP: `init` must be 'map' or 'random', got {self.init!r}.")
        if self.key is not None and not isinstance(self.key, (jax.Array, np.ndarray)):
            raise ValueError(f"NetworkEP: `key` must be None or a jax.random key such as jax.random.PRNGKey(1), "
                             f"got {type(self.key).__name__}: {self.key!r}.")

    def check_model(self, net) -> None:
        if not isinstance(net, TwoLayerNetwork):
            raise ValueError(f"NetworkEP: the model must be a vj.nn.TwoLayerNetwork, got {type(net).__name__}.")

    def init_state(self, net: TwoLayerNetwork) -> NetworkState:
        """The start (`init`, class docstring)."""
        n, D = net.X.shape
        K, dtype = net.num_hidden, net.X.dtype
        key = jax.random.PRNGKey(0) if self.key is None else self.key
        w0 = jax.random.normal(key, (K, D), dtype) / jnp.sqrt(D)
        tau0 = jnp.full((n, K), self.init_precision, dtype)
        z = lambda *shape: jnp.zeros(shape, dtype)
        # w-prior sites: exact at φ = prior mean.
        w_tau = jnp.broadcast_to(jnp.exp(-net.hyper_mean[1 + net.labels]), (K, D)).astype(dtype)
        v_tau, v_nu = z(n), z(n)
        if self.init == "map":
            w0, v0 = map_estimate(net, w0)
        # Site directions: the activations at the starting weights, ḡ_i = [g(w0ᵀx̃_i), 1].
        u = activation(net.X @ w0.T)
        u = jnp.concatenate([u, jnp.ones_like(u[:, :1])], -1)
        if self.init == "map":
            # Pseudo-observations u_iᵀv = u_iᵀv0, of total precision about init_output_precision on
            # every direction the activations span: weak sites centred on the MAP output weights.
            v_tau = jnp.full((n,), jnp.asarray(self.init_output_precision, dtype) / n)
            v_nu = v_tau * (u @ v0)
        sites = NetworkSites(tau0, tau0 * (net.X @ w0.T), v_tau, v_nu, u, z(n), z(n), w_tau, z(K, D),
                             z(K, D), z(K, D), z(K), z(K))
        return NetworkState(sites, jnp.array(0))

    def from_gaussian(self, net, mean, factor):
        raise ValueError("NetworkEP: a network's State cannot be made from a Gaussian over its weights (they enter "
                         "non-linearly); start from the data (init=None), a NetworkPosterior or a NetworkState.")

    def from_expansion(self, net, expansion):
        raise ValueError("NetworkEP: a network has no site expansion at a point w; start from the data (init=None), "
                         "a NetworkPosterior or a NetworkState.")

    def is_state(self, net: TwoLayerNetwork, state) -> bool:
        if not (isinstance(state, NetworkState) and isinstance(state.sites, NetworkSites)):
            return False
        (n, D), K = net.X.shape, net.num_hidden
        shapes = ((n, K),) * 2 + ((n,),) * 2 + ((n, K + 1),) + ((n,),) * 2 + ((K, D),) * 4 + ((K,),) * 2
        return tuple(jnp.shape(x) for x in state.sites) == shapes and jnp.shape(state.iteration) == ()

    def to_state(self, net: TwoLayerNetwork, init) -> NetworkState:
        """A `NetworkState` of this network's shapes, or a `NetworkPosterior`'s ``state``; else `ValueError`."""
        state = init.state if isinstance(init, Posterior) else init
        if self.is_state(net, state):
            return state
        raise ValueError(f"NetworkEP: `init` must be None, a NetworkPosterior or a NetworkState of this network's "
                         f"shapes (e.g. post.state of a NetworkEP fit); got {type(init).__name__}.")

    def fit(self, net: TwoLayerNetwork, state) -> NetworkPosterior:
        """The EP loop from ``state``; every ``key`` (None too) shares its program: the key only seeds the start."""
        return AbstractMethod.fit(dataclasses.replace(self, key=None), net, state)

    def evaluate(self, net: TwoLayerNetwork, s: NetworkSites) -> _Eval:
        """q, and every site's cavity, tilted moments and undamped EP step."""
        X, y, K = net.X, net.y, net.num_hidden
        dtype = X.dtype
        q = _q(net, s)
        h_m, h_V, w_var = _activation_marginals(q, X)
        h_mc, h_Vc, ok_h = cavity(h_m, h_V, s.h_tau, s.h_nu)
        # v cavities: Λ₋ = Λ − τ_i u_i u_iᵀ, by Sherman–Morrison from Σ = Λ⁻¹ (never formed per point):
        # Σ₋ = Σ + c_i b_i b_iᵀ, b_i = Σu_i, c_i = τ_i/(1 − τ_i u_iᵀΣu_i), proper iff 1 − τ_i u_iᵀΣu_i > 0.
        B = s.v_dir @ q.v_cov  # (n, K+1): b_i
        uSu = jnp.sum(B * s.v_dir, -1)
        den = 1.0 - s.v_tau * uSu
        ok_v = den > 0
        c = jnp.where(ok_v, s.v_tau / jnp.where(ok_v, den, 1.0), 0.0)
        # m₋ = Σ₋(r − ν_i u_i) = m − ν_i b_i + c_i b_i (u_iᵀm − ν_i u_iᵀΣu_i).
        mc = q.v_mean - s.v_nu[:, None] * B + (c * (s.v_dir @ q.v_mean - s.v_nu * uSu))[:, None] * B
        Sc_diag = jnp.diagonal(q.v_cov)[None, :] + c[:, None] * B**2
        p_mc, p_Vc, ok_p = cavity(q.phi_mean[0], q.phi_var[0], s.noise_tau, s.noise_nu)
        # Activations under the cavity: Gauss–Hermite nodes (n, K, Q).
        z, wz = GaussHermite(self.activation_nodes).rule(dtype)
        h_nodes = h_mc[..., None] + jnp.sqrt(h_Vc)[..., None] * z
        g_nodes = activation(h_nodes)
        g_mean = jnp.sum(wz * g_nodes, -1)
        g_var = jnp.maximum(jnp.sum(wz * g_nodes**2, -1) - g_mean**2, 0.0)
        gm = jnp.concatenate([g_mean, jnp.ones_like(g_mean[:, :1])], -1)
        gv = jnp.concatenate([g_var, jnp.zeros_like(g_var[:, :1])], -1)
        # E f, Var f and a = Σ₋ḡ, each O(K) per point given Σḡ_i and b_iᵀḡ_i.
        bg = jnp.sum(B * gm, -1)
        a = gm @ q.v_cov + (c * bg)[:, None] * B
        f_m = jnp.sum(mc * gm, -1)
        f_Vv = jnp.sum(gm * a, -1)
        f_V = f_Vv + jnp.sum((Sc_diag + mc**2) * gv, -1)
        # (f, φ_0) tilted: analytic in f, quadrature in φ_0.
        log_z, f_mh, f_Vh, p_mh, p_Vh = log_variance_tilted_moments(
            y, f_m, f_V, p_mc, p_Vc, 1.0, GaussHermite(self.noise_nodes))
        # v tilted by the linear-filter step; the site is rank one in g̃ (Sherman–Morrison).
        gamma = (f_mh - f_m) / f_V
        alpha = (f_Vh - f_V) / f_V**2
        beta = alpha / (1.0 + alpha * f_Vv)
        v_site_tau = -beta
        v_site_nu = gamma * (1.0 - beta * f_Vv) - beta * f_m
        v_mh = mc + a * gamma[:, None]
        v_Vh_diag = Sc_diag + alpha[:, None] * a**2
        # Activations tilted one at a time: f | h_ik = h is Gaussian, mean E f + μ_k(g(h) − ḡ_k), variance
        # Σ_kk g(h)² + 2g(h)Cov(v_k, r) + Var r (r the rest of the sum).
        mu_k, S_kk = mc[:, :K], Sc_diag[:, :K]
        c_k = a[:, :K] - S_kk * g_mean
        g_sq = g_var + g_mean**2
        var_r = jnp.maximum(f_V[:, None] - (S_kk + mu_k**2) * g_sq + mu_k**2 * g_mean**2 - 2 * g_mean * c_k, 0.0)
        M = f_m[:, None, None] + mu_k[..., None] * (g_nodes - g_mean[..., None])
        S = S_kk[..., None] * g_nodes**2 + 2 * g_nodes * c_k[..., None] + var_r[..., None]
        zp, wp = GaussHermite(self.noise_nodes).rule(dtype)
        noise = jnp.exp(p_mc[:, None] + jnp.sqrt(p_Vc)[:, None] * zp)  # (n, P)
        total = S[..., None] + noise[:, None, None, :]
        log_lik = logsumexp(normal_log_density(y[:, None, None, None], M[..., None], total)
                            + jnp.log(wp), axis=-1)  # (n, K, Q)
        log_w = log_lik + jnp.log(wz)
        p = jnp.exp(log_w - logsumexp(log_w, -1, keepdims=True))
        zbar = jnp.sum(p * z, -1)
        h_mh = h_mc + jnp.sqrt(h_Vc) * zbar
        h_Vh = h_Vc * jnp.sum(p * (z - zbar[..., None]) ** 2, -1)
        # Input-weight prior sites N(w_kj | 0, e^{φ_l}) with their φ sites.
        w_m = q.w_mean
        w_mc, w_Vc, ok_w = cavity(w_m, w_var, s.w_tau, s.w_nu)
        idx = 1 + net.labels
        s_m, s_V = q.phi_mean[idx], q.phi_var[idx]
        s_mc, s_Vc, ok_s = cavity(s_m, s_V, s.scale_tau, s.scale_nu)
        _, w_mh, w_Vh, s_mh, s_Vh = log_variance_tilted_moments(0.0, w_mc, w_Vc, s_mc, s_Vc)
        # Positivity sites on v_k: truncated Gaussian moments of N(v | m₋, V₋)·[v ≥ 0].
        v_m, v_V = q.v_mean[:K], jnp.diagonal(q.v_cov)[:K]
        pv_mc, pv_Vc, ok_pos = cavity(v_m, v_V, s.pos_tau, s.pos_nu)
        t = pv_mc / jnp.sqrt(pv_Vc)
        lam = jnp.exp(-0.5 * t**2 - 0.5 * LOG_2PI - log_ndtr(t))  # φ(t)/Φ(t)
        pv_mh = pv_mc + jnp.sqrt(pv_Vc) * lam
        pv_Vh = pv_Vc * (1.0 - lam * (lam + t))

        # Steps (undamped), where each site's cavity is proper and its tilted moments finite.
        def scalar_step(m, V, mh, Vh, ok):
            ok = ok & jnp.isfinite(mh) & (Vh > 0)
            dt, dn = site_step(m, V, mh, jnp.where(ok, Vh, V))
            res = jnp.where(ok, moment_residual(m, V, mh, jnp.where(ok, Vh, V)), 0.0)
            return jnp.where(ok, dt, 0.0), jnp.where(ok, dn, 0.0), jnp.max(res, initial=0.0)

        ok_i = ok_v & ok_p & jnp.isfinite(log_z) & (f_Vh > 0) & jnp.all(ok_h, -1)
        if self.nonnegative_activation_sites:
            # Cap the tilted variance at the cavity's: the site's precision becomes ≥ 0 (class docstring).
            h_Vh = jnp.minimum(h_Vh, h_Vc)
        dh_t, dh_n, r_h = scalar_step(h_m, h_V, h_mh, h_Vh, ok_h & ok_i[:, None])
        dp_t, dp_n, r_p = scalar_step(q.phi_mean[0], q.phi_var[0], p_mh, p_Vh, ok_i)
        dw_t, dw_n, r_w = scalar_step(w_m, w_var, w_mh, w_Vh, ok_w & ok_s)
        ds_t, ds_n, r_s = scalar_step(s_m, s_V, s_mh, s_Vh, ok_w & ok_s)
        dpos_t, dpos_n, r_pos = scalar_step(v_m, v_V, pv_mh, pv_Vh, ok_pos)
        ok_vi = ok_i & jnp.isfinite(beta) & (1.0 + alpha * f_Vv > 0)
        # The site moves to the rank-one site in the current direction ḡ_i (damped in τ, ν and u alike:
        # at a fixed point u_i = ḡ_i, and the site is the exact linear-filter site).
        dv_t = jnp.where(ok_vi, v_site_tau - s.v_tau, 0.0)
        dv_n = jnp.where(ok_vi, v_site_nu - s.v_nu, 0.0)
        dv_u = jnp.where(ok_vi[:, None], gm - s.v_dir, 0.0)
        v_sd = jnp.sqrt(jnp.diagonal(q.v_cov))
        r_v = jnp.where(ok_vi[:, None], jnp.abs(v_mh - q.v_mean) / v_sd
                        + jnp.abs(jnp.log(v_Vh_diag / v_sd**2)), 0.0)
        residuals = jnp.stack([r_h, r_p, r_w, r_s, r_pos, jnp.max(r_v)])
        residual = jnp.max(residuals)
        step = NetworkSites(dh_t, dh_n, dv_t, dv_n, dv_u, dp_t, dp_n, dw_t, dw_n, ds_t, ds_n, dpos_t, dpos_n)
        # Only q must be proper: a site whose cavity is improper (e.g. a prior site on the weights of a
        # hidden unit the data ignore, whose cavity precision is a rounding of 0) is skipped this time.
        proper = q.proper & jnp.isfinite(residual)
        return _Eval(q, step, jnp.where(proper, residual, jnp.inf), proper, residuals)

    def solve(self, net: TwoLayerNetwork, state: NetworkState) -> NetworkPosterior:
        """Parallel EP from ``state``: damped steps with momentum, halved until q is proper (class docstring)."""
        frozen = jax.lax.stop_gradient(net)
        state = jax.lax.stop_gradient(state)
        sites, offset = state.sites, state.iteration
        evaluate = lambda s: self.evaluate(frozen, s)
        shape = jax.eval_shape(evaluate, sites)
        ev = jax.tree_util.tree_map(lambda a: jnp.full(a.shape, jnp.nan if a.dtype != bool else False, a.dtype), shape)
        dtype = net.X.dtype
        trace = jnp.full((self.max_iter + 1,), jnp.nan, dtype)

        prior = self.damping if self.prior_damping is None else self.prior_damping

        def done(k, loop):
            _, ev, stuck, started, *_ = loop
            return stuck | (started & (ev.residual <= self.tol))

        def step(k, loop):
            sites, ev, _, started, previous, trace, shrunk = loop
            # The first pass (k = 0) only evaluates the start; iteration k is offset + k of the schedule.
            beta = jnp.where(offset + k > _MOMENTUM_AFTER, self.momentum, 0.0)
            late = jnp.where(offset + k > _PRIOR_DAMPING_AFTER, prior, self.damping)
            rates = NetworkSites(*(late if name in ("w_tau", "w_nu", "scale_tau", "scale_nu") else self.damping
                                   for name in NetworkSites._fields))
            move = jax.tree_util.tree_map(lambda d, p, delta: jnp.where(started, delta * d + beta * p, 0.0),
                                          ev.step, previous, rates)
            # Traced once: the first trial is the halving loop's first iteration.
            alpha, new, ok, halvings = backtrack(lambda a: evaluate(sites.add(move, a)), lambda a, new: new.proper,
                                                 jnp.ones((), dtype), _MAX_HALVINGS, placeholder=ev)
            sites = select(ok, sites.add(move, alpha), sites)
            keep = ok & started & (new.residual <= ev.residual)
            previous = jax.tree_util.tree_map(lambda d: jnp.where(keep, alpha * d, 0.0), move)
            ev = select(ok, new, ev)
            return (sites, ev, ~ok, started | ok, previous, trace.at[k].set(ev.residual),
                    shrunk + (started & (halvings > 0)))

        zeros = jax.tree_util.tree_map(jnp.zeros_like, sites)
        no = jnp.array(False)
        (sites, ev, stuck, _, _, trace, shrunk), k = iterate(step, (sites, ev, no, no, zeros, trace, jnp.array(0)),
                                                             self.max_iter + 1, done)
        q = ev.q
        eye = jnp.eye(net.X.shape[1], dtype=dtype)
        w_cov = _per_unit(lambda f: f.solve(eye), q.w_precision)
        iterations = k - 1  # the first pass only evaluated the start
        info = NetworkInfo(residuals=ev.residuals, residual_trace=trace, shrunk=shrunk)
        status = Status.of(ev.residual <= self.tol, value=ev.residual, stalled=stuck)
        diagnostics = Diagnostics(iterations=iterations, status=status, stationarity=ev.residual,
                                  objective_trace=jnp.full((self.max_iter + 1,), jnp.nan, dtype), method="NetworkEP",
                                  solver="parallel", num_value_evals=k, info=info)
        return NetworkPosterior(q.w_mean, w_cov, q.v_mean, q.v_cov, q.phi_mean, q.phi_var, diagnostics, net,
                                NetworkState(sites, offset + iterations))
