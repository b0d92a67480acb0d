"""Why LVB with Lanczos variances designs worse than exact LVB (16 × 16 images, the reduced Figs. 5.3–5.4 set-up).

On each image (same seeds as `design_images.py`: N0 random unit-norm rows) this fits LVB with exact
variances and LVB with k Lanczos vectors to the same data, then separates the two places where the Lanczos
estimate can hurt:

- the fit: ℓ2 error of each mean on the same data, and the share of tr P⁻¹ the Lanczos vectors hold;
- the design: the free-design block (K rows) chosen from each posterior, scored by its information gain
  under the *exact* LVB posterior, and the ℓ2 error of the exact LVB refit after measuring that block
  (and, for reference, after K random unit-norm rows).

    python benchmarks/design_lvb_lanczos.py --images 8 --tag 16px_k20
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee, mean_se  # noqa: E402
from design_images import IMAGES, NU2, image_prior, load_image  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--start", type=int, default=25)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--lanczos", type=int, default=20)
    parser.add_argument("--lvb-iter", type=int, default=30)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    name = "design_lvb_lanczos" + (f"_{args.tag}" if args.tag else "")
    shape, D = (args.size, args.size), args.size**2
    B, prior, _ = image_prior(shape)
    exact = vj.LVB()
    approx = vj.LVB(variances="lanczos", num_lanczos=args.lanczos, tol=1e-2, max_iter=args.lvb_iter, num_probes=1)
    log = Tee()
    log(f"# {name}: {args.images} images {shape}, N0={args.start}, block of {args.rows} rows, LVB exact against "
        f"LVB Lanczos k={args.lanczos} (tol 1e-2, <= {args.lvb_iter} loops), nu2={NU2}")
    keys = ["err_exact", "err_lanczos", "share", "gain_exact_design", "gain_lanczos_design", "gain_random",
            "refit_exact_design", "refit_lanczos_design", "refit_random", "lanczos_refit_exact_design",
            "lanczos_refit_lanczos_design"]
    table = {k: [] for k in keys}
    for i, image in enumerate(IMAGES[:args.images]):
        w = load_image(image, args.size).ravel()
        rng = np.random.default_rng(100 + i)
        M = rng.normal(size=(args.start, D))
        M /= np.linalg.norm(M, axis=1, keepdims=True)
        y = M @ w + np.sqrt(NU2) * rng.normal(size=args.start)
        model = vj.design.sparse_linear_model(M, y, NU2, B, prior)
        pe, pl = vj.infer(model, exact), vj.infer(model, approx)
        key = jax.random.PRNGKey(i)
        rows = {"exact": np.asarray(vj.design.free_design(pe, args.rows, key=key)[0]),
                "lanczos": np.asarray(vj.design.free_design(pl, args.rows, key=key)[0]),
                "random": np.asarray(vj.design.random_rows(key, args.rows, D))}
        noise = np.sqrt(NU2) * np.random.default_rng(500 + i).normal(size=args.rows)  # the same noise for every block

        def refit(method, new, init):
            m2 = vj.design.sparse_linear_model(np.concatenate([M, new]), np.concatenate([y, new @ w + noise]), NU2, B,
                                               prior)
            return float(np.linalg.norm(np.asarray(vj.infer(m2, method, init=init).mean) - w))

        row = {"err_exact": float(np.linalg.norm(np.asarray(pe.mean) - w)),
               "err_lanczos": float(np.linalg.norm(np.asarray(pl.mean) - w)),
               "share": float(pl.diagnostics.info.variance_fraction)}
        for k in ("exact", "lanczos", "random"):
            row[f"gain_{k}_design" if k != "random" else "gain_random"] = float(
                vj.design.information_gain(pe, rows[k], NU2))
            row[f"refit_{k}_design" if k != "random" else "refit_random"] = refit(exact, rows[k], pe)
        for k in ("exact", "lanczos"):
            row[f"lanczos_refit_{k}_design"] = refit(approx, rows[k], pl)
        for k in keys:
            table[k].append(row[k])
        log(f"{image:22s} " + ", ".join(f"{k} {row[k]:.3f}" for k in keys))
    log("mean ± s.e. over images:")
    for k in keys:
        m, s = mean_se(table[k])
        log(f"  {k:30s} {m:8.3f} ± {s:.3f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"args": vars(args), "images": IMAGES[:args.images],
                                                      "table": table}, indent=1))
    log.save(name)


if __name__ == "__main__":
    main()
