"""How much of LVB's marginal variance k Lanczos vectors capture on the image design problem (thesis §5.4).

At the exact LVB fit of a size × size image (camera, N random rows; the filters and τ of
`design_images.py`), P = Σ_n A_n h_n h_nᵀ is formed once and its eigenvalues computed. For several k the
table gives the share of the total variance tr P⁻¹ that the Lanczos estimates diag(Q T⁻¹ Qᵀ) hold, their
median ratio to the exact variances, and the share the best rank-k estimate (S's top-k eigenvalues) would
hold: Lanczos from a random start spends its vectors on both ends of P's spectrum, and on a compact
spectrum its Ritz vectors are not yet eigenvectors, so it holds far less than the best rank k.

    python benchmarks/design_lanczos_share.py --size 32 --start 50
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee  # noqa: E402
from design_images import NU2, load_image  # noqa: E402
from vijax.methods import _gaussian, lvb  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--start", type=int, default=50)
    parser.add_argument("--ks", default="20,80,256")
    args = parser.parse_args()
    name = f"design_lanczos_share_{args.size}"
    log = Tee()
    shape, D = (args.size, args.size), args.size**2
    fd, wav = vj.design.filters.finite_differences(shape, periodic=True), vj.design.filters.wavelets(shape)
    B = vj.design.filters.stack(fd, wav)
    tau = jnp.concatenate([jnp.full(fd.shape[0], 0.1), jnp.full(wav.shape[0], 0.14)])
    w = load_image("camera", args.size).ravel()
    rng = np.random.default_rng(100)
    M = rng.normal(size=(args.start, D))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    y = M @ w + np.sqrt(NU2) * rng.normal(size=args.start)
    model = vj.design.sparse_linear_model(M, y, NU2, B, vj.potentials.Laplace(scale=tau))
    start = time.perf_counter()
    exact = vj.infer(model, vj.LVB())
    log(f"# {name}: camera {shape} (D={D}), N={args.start}; exact LVB fit {time.perf_counter() - start:.0f} s "
        f"(with compilation; shared 2-core machine under load), converged {bool(exact.diagnostics.converged)}")
    xi = lvb._update(model, "jaakkola", exact.mean, exact.factor)
    product, _, _ = _gaussian.precision_operator(model, lvb._quadratics(xi, model, "jaakkola"))
    P = np.asarray(jax.vmap(product, in_axes=1, out_axes=1)(jnp.eye(D)))
    lam = np.linalg.eigvalsh(P)
    variances = np.asarray(exact.factor.variances())
    rows = []
    for k in (int(k) for k in args.ks.split(",")):
        v0 = jax.random.rademacher(jax.random.PRNGKey(0), (D,), jnp.float64)
        estimate = np.asarray(vj.design.lanczos_variances(product, D, k, v0=v0)[0])
        row = {"k": k, "k_over_D": k / D, "lanczos_share": float(estimate.sum() / variances.sum()),
               "median_ratio": float(np.median(estimate / variances)),
               "best_rank_k_share": float(np.sum(1 / lam[:k]) / np.sum(1 / lam))}
        rows.append(row)
        log(f"k={k:4d} (k/D {k / D:.3f}): Lanczos share of tr S {row['lanczos_share']:.3f}, median estimate/exact "
            f"{row['median_ratio']:.3f}; best rank-k share {row['best_rank_k_share']:.3f}")
    log(f"cond(P) = {lam[-1] / lam[0]:.3g}; S's largest eigenvalue {1 / lam[0]:.3g}, median {np.median(1 / lam):.3g}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    log.save(name)


if __name__ == "__main__":
    main()
