"""Khan's 1-D binary latent Gaussian model (thesis §4.7, Fig. 4.4): how the error of a local bound
on the logistic likelihood biases the fitted variance.

    python benchmarks/khan_1d_binary.py

The model is z ~ N(μ, σ²), y | z ~ Bernoulli(σ(z)). Data come from μ* = σ* = 2, in the limit of
infinite data (so p* = p(y = 1 | θ*) = 0.7752 and the average log likelihood is
L(σ) = p* log p_σ(1) + (1 − p*) log p_σ(0)); μ is fixed at μ* and σ is fitted by maximising
L, or its lower bound L̂(σ) = p* log p̂_σ(1) + (1 − p*) log p̂_σ(0) with
p̂_σ(y) = ∫ exp(f̲(yz)) N(z | μ, σ²) dz ≤ p_σ(y) for a lower bound f̲ ≤ log σ on the sigmoid
(thesis eq. 4.46; here both labels are bounded, so L̂ ≤ L for every σ). For Jaakkola and Böhning
the variational parameter is optimised for each label and σ; the piecewise bounds have none
(``PiecewiseLogistic.log_expected_phi`` is p̂ in closed form). Prints σ̂ and the bound's gap at σ*
for each bound, and saves the curves to ``benchmarks/results/khan_1d_binary.png``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import integrate, optimize
from scipy.special import expit

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

from _common import RESULTS  # noqa: E402

MU, SIGMA_STAR = 2.0, 2.0
SIGMA_MIN = 0.01  # σ is searched on [SIGMA_MIN, 5]


def exact_log_p(y, sigma):
    """log p(y | μ, σ) by adaptive quadrature (y = ±1)."""
    dens = lambda z: np.exp(-0.5 * ((z - MU) / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))
    lo, hi = MU - 40 * sigma, MU + 40 * sigma
    return np.log(integrate.quad(lambda z: expit(y * z) * dens(z), lo, hi, points=[MU], limit=200,
                                 epsabs=1e-14, epsrel=1e-12)[0])


def quadratic_log_mass(bound, xi, m, s):
    """log ∫ exp(a x − ½ A x² + c) N(x | m, s²) dx for a `vj.lvb` quadratic bound at ξ."""
    a, A, c = (float(v) for v in bound.quadratic(jnp.asarray(xi)))
    k = 1 + A * s**2
    return -0.5 * np.log(k) + (2 * m * a + a**2 * s**2 - A * m**2) / (2 * k) + c


def lvb_log_p(bound, y, sigma):
    """max over ξ of the bound on log p(y | μ, σ); x = y z ~ N(y μ, σ²)."""
    res = optimize.minimize_scalar(lambda xi: -quadratic_log_mass(bound, xi, y * MU, sigma),
                                   bounds=(-30.0, 30.0), method="bounded", options={"xatol": 1e-10})
    return -res.fun


def piecewise_log_p(site, y, sigma):
    return float(site.log_expected_phi(jnp.asarray(y * MU), jnp.asarray(sigma)))


def fitted_sigma(log_p, p_star):
    """argmax over σ of p* log p(1) + (1 − p*) log p(0): a grid, then a bounded refinement."""
    curve = lambda s: p_star * log_p(1, s) + (1 - p_star) * log_p(-1, s)
    grid = np.linspace(SIGMA_MIN, 5.0, 100)
    values = np.array([curve(s) for s in grid])
    i = int(np.argmax(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(lambda s: -curve(s), bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-6})
    return (res.x, -res.fun) if -res.fun >= values[i] else (grid[i], values[i])


def main():
    p_star = np.exp(exact_log_p(1, SIGMA_STAR))
    bounds = {"exact": exact_log_p,
              "Böhning": lambda y, s: lvb_log_p(vj.lvb.Bohning(), y, s),
              "Jaakkola": lambda y, s: lvb_log_p(vj.lvb.Jaakkola(), y, s)}
    for kind, tag, pieces in (("linear", "L", (6, 10, 20)), ("quadratic", "Q", (3, 5, 20))):
        for R in pieces:
            site = vj.potentials.PiecewiseLogistic(R, kind)
            bounds[f"{tag}{R}"] = lambda y, s, site=site: piecewise_log_p(site, y, s)

    L = lambda log_p, s: p_star * log_p(1, s) + (1 - p_star) * log_p(-1, s)
    L_star = L(exact_log_p, SIGMA_STAR)
    print(f"p* = {p_star:.4f}, L* = {L_star:.5f} (μ fixed at {MU}, σ* = {SIGMA_STAR})")
    print(f"{'bound':>9} {'ε_R':>9} {'σ̂':>7} {'L̂(σ̂)':>10} {'L* − L̂(σ*)':>12}")
    sigmas = np.linspace(0.02, 5.0, 120)
    curves = {}
    for name, log_p in bounds.items():
        s_hat, value = fitted_sigma(log_p, p_star)
        eps = ""
        if name[0] in "LQ":
            eps = f"{vj.piecewise.max_error('linear' if name[0] == 'L' else 'quadratic', int(name[1:])):.1e}"
        shown = "→ 0" if s_hat <= SIGMA_MIN * (1 + 1e-6) else f"{s_hat:.3f}"  # at the grid's lower end
        print(f"{name:>9} {eps:>9} {shown:>7} {value:>10.5f} {L_star - L(log_p, SIGMA_STAR):>12.2e}")
        curves[name] = (np.array([L(log_p, s) for s in sigmas]), s_hat, value)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    panels = [("Böhning", "Jaakkola"), ("L6", "L10", "L20"), ("Q3", "Q5", "Q20")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, names in zip(axes, panels):
        ax.plot(sigmas, curves["exact"][0], "b-", lw=2, label="exact L(σ)")
        ax.plot([SIGMA_STAR], [L_star], "bo")
        for j, name in enumerate(names):
            values, s_hat, top = curves[name]
            shade = 1.0 - 0.6 * j / max(len(names) - 1, 1)  # darker: more pieces (as in the thesis)
            ax.plot(sigmas, values, "--", color=(shade, 0, 0), label=name)
            ax.plot([s_hat], [top], "x", color=(shade, 0, 0))
        ax.set_xlabel("σ")
        ax.set_ylim(L_star - 0.25, L_star + 0.02)
        ax.legend(loc="lower right")
    axes[0].set_ylabel("average log likelihood")
    fig.suptitle("1-D binary latent Gaussian model, μ* = σ* = 2 (Khan thesis Fig. 4.4)")
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / "khan_1d_binary.png", dpi=120)
    print(f"saved {RESULTS / 'khan_1d_binary.png'}")


if __name__ == "__main__":
    main()
