"""Shared by the tests: closed-form answers computed with NumPy/SciPy only, and a counter of compiled programs."""

import jax
import jax.numpy as jnp
import numpy as np


def gaussian_posterior(prior_mean, prior_cov, X, y, noise_var):
    """Exact posterior and log evidence of y ~ N(X w, noise_var I), w ~ N(prior_mean, prior_cov)."""
    prec = np.linalg.inv(prior_cov) + X.T @ X / noise_var
    cov = np.linalg.inv(prec)
    mean = cov @ (np.linalg.solve(prior_cov, prior_mean) + X.T @ y / noise_var)
    K = X @ prior_cov @ X.T + noise_var * np.eye(len(y))
    r = y - X @ prior_mean
    sign, logdet = np.linalg.slogdet(2 * np.pi * K)
    log_z = -0.5 * (logdet + r @ np.linalg.solve(K, r))
    return mean, cov, log_z


def glm_log_joint(W, X, y, likelihood, prior_variance=None, scale=1.0, df=3.0):
    """log p(y, w) of a GLM at every row of ``W`` (shape (G, D)), in NumPy/SciPy only.

    ``likelihood``: "logistic" (y in {0, 1}), "probit", "poisson" (log link) or "student_t" (identity
    link, ``df``, ``scale``); ``prior_variance`` None is a flat prior (no Gaussian term). The sites are
    `glm_site_functions`' with the constants they leave out."""
    from scipy import special

    eta = np.asarray(X) @ np.asarray(W).T  # (N, G)
    y = np.asarray(y, dtype=float)
    signed = likelihood in ("logistic", "probit")
    x = (2 * y - 1)[:, None] * eta if signed else eta
    constant = {"logistic": 0.0, "probit": 0.0, "poisson": -special.gammaln(y + 1),
                "student_t": special.gammaln(0.5 * (df + 1)) - special.gammaln(0.5 * df)
                - 0.5 * np.log(df * np.pi * scale**2)}[likelihood]
    terms = glm_site_functions(likelihood, None if signed else y, scale=scale, df=df)(x)[0]
    value = (terms + np.reshape(constant, (-1, 1))).sum(axis=0)
    if prior_variance is not None:
        d = W.shape[-1]
        value = value - 0.5 * np.sum(W**2, axis=-1) / prior_variance - 0.5 * d * np.log(2 * np.pi * prior_variance)
    return value


def grid_posterior(log_joint, dim=2, points=201, chunk=2000):
    """Exact log Z, mean, covariance and mode of exp(log_joint(w)) for w in R² by a grid (NumPy/SciPy only).

    The grid lies in the coordinates whitened by the curvature at the mode (found by SciPy), spans
    ±10 of those units and is widened until the density at its edges is below e⁻³⁰ of its peak, so
    skewed posteriors (separable data under a wide prior) are covered too. The rectangle rule on a
    smooth density that has decayed at the edges is accurate to far below the tolerances tested."""
    from scipy import optimize, special

    with np.errstate(over="ignore", invalid="ignore"):  # the mode search may try far-off points
        return _grid_posterior(log_joint, dim, points, chunk, optimize, special)


def _grid_posterior(log_joint, dim, points, chunk, optimize, special):
    f = lambda w: -float(log_joint(np.asarray(w)[None, :])[0])
    mode = optimize.minimize(f, np.zeros(dim), method="BFGS", options={"gtol": 1e-10}).x
    mode = optimize.minimize(f, mode, method="Nelder-Mead", options={"xatol": 1e-12, "fatol": 1e-14,
                                                                      "maxiter": 4000}).x
    h = 1e-4 * np.maximum(np.abs(mode), 1.0)
    hessian = np.empty((dim, dim))
    for i in range(dim):
        for j in range(dim):
            ei, ej = np.eye(dim)[i] * h[i], np.eye(dim)[j] * h[j]
            hessian[i, j] = (f(mode + ei + ej) - f(mode + ei - ej) - f(mode - ei + ej) + f(mode - ei - ej)) / (4 * h[i] * h[j])
    lam, V = np.linalg.eigh(0.5 * (hessian + hessian.T))
    T = V / np.sqrt(np.maximum(lam, 1e-300))  # w = mode + T u, u ~ roughly N(0, I)
    width = 10.0
    for _ in range(8):
        u = np.linspace(-width, width, points)
        U = np.stack(np.meshgrid(u, u, indexing="ij"), axis=-1).reshape(-1, dim)
        Wg = mode + U @ T.T
        values = np.concatenate([log_joint(Wg[i:i + chunk]) for i in range(0, len(Wg), chunk)])
        grid = values.reshape(points, points)
        edge = max(grid[0].max(), grid[-1].max(), grid[:, 0].max(), grid[:, -1].max())
        if edge < grid.max() - 30:
            break
        width *= 2
    else:
        raise AssertionError("grid_posterior: the posterior does not decay (improper?)")
    cell = (u[1] - u[0]) ** dim * abs(np.linalg.det(T))
    log_z = special.logsumexp(values) + np.log(cell)
    weights = np.exp(values - special.logsumexp(values))
    mean = weights @ Wg
    centred = Wg - mean
    return log_z, mean, (weights[:, None] * centred).T @ centred, mode


# ------------------------------------------------------------------------------------------ data


def regression_data(rng, n=30, d=4, noise=0.6):
    """Linear-regression data: X (n, d) standard normal, y = X w + noise · ε with w ~ N(0, I)."""
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + noise * rng.normal(size=n)
    return X, y


def logistic_data(rng, n=60, d=3):
    """Logistic-regression data: X (n, d) standard normal, y ∈ {0, 1} with p(y=1) = σ(x·w), w ~ N(0, I)."""
    from scipy.special import expit

    X = rng.normal(size=(n, d))
    y = (rng.random(n) < expit(X @ rng.normal(size=d))).astype(float)
    return X, y


def spd(rng, d):
    """A random symmetric positive-definite (d, d) matrix A Aᵀ/d + ½ I, A standard normal."""
    A = rng.normal(size=(d, d))
    return A @ A.T / d + 0.5 * np.eye(d)


def neal(seed, n):
    """Neal's (1997) robust-regression data: f(x) = 0.3 + 0.4x + 0.5 sin(2.7x) + 1.1/(1+x²), 10% outliers."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    f = 0.3 + 0.4 * x + 0.5 * np.sin(2.7 * x) + 1.1 / (1 + x**2)
    return x, f + np.where(rng.uniform(size=n) < 0.1, 1.0, 0.1) * rng.normal(size=n)


# ------------------------------------------------------------------------------------------ oracles


def se_kernel(x, variance=1.0, lengthscale=1.0, jitter=1e-8):
    """Squared-exponential Gram matrix of 1-D inputs x (n,), in NumPy, plus ``jitter`` · I:
    K_ij = variance · exp(−(x_i − x_j)² / (2 lengthscale²))."""
    x = np.asarray(x)
    return variance * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / lengthscale**2) + jitter * np.eye(len(x))


def quad_moments(log_phi, m, v, power=1.0):
    """log Ẑ, mean and variance of the tilted density φ(x)^power N(x | m, v) by SciPy adaptive quadrature."""
    from scipy import integrate, stats

    s = np.sqrt(v)
    log_f = lambda x: power * log_phi(x) + stats.norm.logpdf(x, m, s)
    # Breakpoints at the cavity and at the site's own peak keep quad accurate for narrow peaks.
    points = sorted({m - 8 * s, m, m + 8 * s, 0.0, 0.7, 3.0})
    lo, hi = min(points) - 40 * s - 40, max(points) + 40 * s + 40
    shift = np.max(log_f(np.linspace(lo, hi, 20001)))
    kw = dict(points=points, limit=1000, epsabs=0, epsrel=1e-12)
    z = integrate.quad(lambda x: np.exp(log_f(x) - shift), lo, hi, **kw)[0]
    mean = integrate.quad(lambda x: x * np.exp(log_f(x) - shift), lo, hi, **kw)[0] / z
    var = integrate.quad(lambda x: (x - mean) ** 2 * np.exp(log_f(x) - shift), lo, hi, **kw)[0] / z
    return np.log(z) + shift, mean, var


# ------------------------------------------------------------------------------------------ optimality, loop-free
# Whether a fit is at its own optimum, checked in NumPy (no program to compile) from the optimality
# conditions themselves, instead of by a tight refit: independent of the algorithm that got there.


def glm_site_functions(likelihood, y=None, scale=0.3, df=3.0, loc=0.0):
    """``x ↦ (log φ(x), (log φ)'(x))`` of a site group in the sites' own coordinates x (NumPy), for ``x`` of
    shape ``(N, K)``, constants left out: "logistic" (log σ(x); a GLM's x = (2y − 1)η), "probit" (log Φ(x)),
    "poisson" (counts ``y``, log link), "student_t" (data ``y``, ``df``, ``scale``), "laplace" (−|x − loc|/scale)."""
    y = None if y is None else np.asarray(y, float)[:, None]
    from scipy import special

    if likelihood == "logistic":
        return lambda x: (-np.logaddexp(0.0, -x), special.expit(-x))
    if likelihood == "probit":
        return lambda x: (special.log_ndtr(x), np.exp(-0.5 * x**2 - 0.5 * np.log(2 * np.pi) - special.log_ndtr(x)))
    if likelihood == "poisson":
        return lambda x: (y * x - np.exp(x), y - np.exp(x))
    if likelihood == "student_t":
        a = df * scale**2
        return lambda x: (-0.5 * (df + 1) * np.log1p((y - x) ** 2 / a), (df + 1) * (y - x) / (a + (y - x) ** 2))
    if likelihood == "laplace":
        return lambda x: (-np.abs(x - loc) / scale, -np.sign(x - loc) / scale)
    raise ValueError(likelihood)


def _expectations(fn, mean, var):
    """⟨(log φ)'⟩ and ⟨(log φ)''⟩ = ⟨(x − m)(log φ)'⟩/v (Stein's identity: right for kinks such as the
    Laplace site's too) under N(mean_n, var_n), by SciPy's adaptive quadrature over ±40 sds (accurate however
    wide N(mean_n, var_n) is against the width of φ's features, where Gauss–Hermite is not). A site with
    var_n = 0 (an empty row of H) gets (log φ)'(mean_n) and 0."""
    from scipy import integrate

    live = var > 0
    sd = np.sqrt(np.where(live, var, 1.0))
    n = len(mean)

    def integrand(z):
        with np.errstate(over="ignore"):
            first = fn((mean + sd * z)[:, None])[1][:, 0]
        density = np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
        return density * np.concatenate([first, z * first / sd])

    values, _ = integrate.quad_vec(integrand, -40.0, 40.0, epsabs=1e-14, epsrel=1e-12, points=[0.0])
    first, second = values[:n], values[n:]
    return np.where(live, first, fn(mean[:, None])[1][:, 0]), np.where(live, second, 0.0)


def gkl_optimality(mean, cov, groups, prior_precision, prior_mean=None, diagonal=False):
    """How far q = N(``mean``, ``cov``) is from a stationary point of the G-KL bound, in NumPy, for the
    model with Gaussian factor N(prior_mean, prior_precision⁻¹) (a zero or singular precision allowed) and
    site groups ``groups`` = [(H_g dense (N_g, D), fn_g from `glm_site_functions`), …] on x = H_g w.

    At the optimum ∂B/∂m = −Λ(m − μ) + Σ_g H_gᵀ⟨(log φ)'⟩ = 0 and S⁻¹ = Λ − Σ_g H_gᵀ diag⟨(log φ)''⟩ H_g (only
    its diagonal for a ``diagonal`` q). Returns ``(step, precision)``: the natural-gradient step S ∂B/∂m in
    posterior standard deviations (the distance to the optimum's mean, to first order) and the largest
    error of the implied precision, relative to √(P_ii P_jj)."""
    mean, S = np.asarray(mean, float), np.asarray(cov, float)
    Lam = np.asarray(prior_precision, float)
    mu0 = np.zeros_like(mean) if prior_mean is None else np.asarray(prior_mean, float)
    grad, implied = -Lam @ (mean - mu0), Lam.copy()
    for H, fn in groups:
        H = np.asarray(H, float)
        first, second = _expectations(fn, H @ mean, np.einsum("nd,de,ne->n", H, S, H))
        grad, implied = grad + H.T @ first, implied - H.T @ (second[:, None] * H)
    sd = np.sqrt(np.diag(S))
    P = np.linalg.inv(S)
    if diagonal:
        P, implied = np.diag(1.0 / np.diag(S)), np.diag(np.diag(implied))
    norm = np.sqrt(np.outer(np.diag(P), np.diag(P)))
    return np.max(np.abs(S @ grad) / sd), np.max(np.abs(implied - P) / norm)


def ep_residual(precision, shift, H, prior_precision, fn, prior_mean=None, width=14.0, points=4001):
    """EP's moment-matching residual max_n |m̂_n − m_n|/√V_n + |log(V̂_n/V_n)| at the sites exp(ν_n x − ½τ_n x²)
    on x = h_nᵀw (``precision`` τ, ``shift`` ν), in NumPy: q's marginals N(m_n, V_n), the cavities, and the
    tilted moments by the rectangle rule over ±``width`` cavity standard deviations. Zero at a fixed point."""
    H, Lam = np.asarray(H, float), np.asarray(prior_precision, float)
    tau, nu = np.asarray(precision, float), np.asarray(shift, float)
    mu0 = np.zeros(H.shape[1]) if prior_mean is None else np.asarray(prior_mean, float)
    S = np.linalg.inv(Lam + H.T @ (tau[:, None] * H))
    m = S @ (Lam @ mu0 + H.T @ nu)
    mn, V = H @ m, np.einsum("nd,de,ne->n", H, S, H)
    cav_precision = 1.0 / V - tau
    Vc = 1.0 / cav_precision
    mc = (mn / V - nu) * Vc
    z = np.linspace(-width, width, points)
    x = mc[:, None] + np.sqrt(Vc)[:, None] * z[None, :]
    log_w = fn(x)[0] - 0.5 * z**2
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    m_hat = np.sum(w * x, axis=1)
    V_hat = np.sum(w * (x - m_hat[:, None]) ** 2, axis=1)
    return np.max(np.abs(m_hat - mn) / np.sqrt(V) + np.abs(np.log(V_hat / V)))


# ------------------------------------------------------------------------------------------ diagnostics


def gradient_and_difference(f, x, step):
    """``(∇f(x), (f(x + step) − f(x − step))/2)``: the gradient and the central difference along
    ``step`` (divide by |step|), the values at x ± step from the same `jax.value_and_grad` program as
    the gradient, so a refitted finite difference compiles no plain fit of its own."""
    value_and_grad = jax.value_and_grad(f)
    grad = value_and_grad(x)[1]
    return grad, (value_and_grad(x + step)[0] - value_and_grad(x - step)[0]) / 2


def sparse_logistic_rows(dim, num, nnz, seed=0):
    """A realsim-shaped sparse logistic regression's data (NumPy only): ``(values, indices, y)`` of an
    ``(num, dim)`` matrix with about ``nnz`` non-zeros (≈ nnz/num per row, columns drawn with Zipf-like
    popularity, duplicates summed, rows of unit norm) and labels ±1 from w ~ N(0, I) with τ = 3."""
    rng = np.random.default_rng(seed)
    per_row = rng.poisson(nnz / num - 1, size=num) + 1
    rows = np.repeat(np.arange(num), per_row)
    popularity = 1.0 / (np.arange(dim) + 10.0)
    cols = rng.permutation(dim)[rng.choice(dim, size=rows.size, p=popularity / popularity.sum())]
    key, inverse = np.unique(rows.astype(np.int64) * dim + cols, return_inverse=True)
    rows, cols = key // dim, key % dim
    values = np.bincount(inverse, weights=rng.gamma(1.0, 1.0, size=inverse.size))
    values /= np.sqrt(np.bincount(rows, weights=values**2, minlength=num))[rows]
    activation = np.bincount(rows, weights=values * rng.normal(size=dim)[cols], minlength=num)
    y = np.where(rng.random(num) < 1 / (1 + np.exp(-3.0 * activation)), 1.0, -1.0)
    return values, np.stack([rows, cols], axis=1), y


# ----------------------------------------------------------------------------------------------
# Counting the programs XLA builds (compiled or loaded from the persistent cache)

# The one compile listener of the tests: `programs` below, conftest's per-test record (VIJAX_TEST_PROGRAMS)
# and test_types' counts read it. JAX records a backend compile for a program loaded from the persistent
# cache (conftest) too, so a loaded program counts as built: without the cache it would have been compiled.
_BUILT = {"programs": 0, "seconds": 0.0}


def _on_duration(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _BUILT["programs"] += 1
        _BUILT["seconds"] += duration


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def built():
    """``(programs built so far, seconds spent compiling them)`` in this process."""
    return _BUILT["programs"], _BUILT["seconds"]


def programs(fn, *args):
    """``(result, the number of programs XLA built while computing it)``."""
    jnp.asarray(0.5)  # JAX builds one program, once per process, to convert a Python float (traced settings)
    before = _BUILT["programs"]
    out = jax.block_until_ready(fn(*args))
    return out, _BUILT["programs"] - before
