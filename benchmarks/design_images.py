"""Sequential experimental design on natural images (Challis thesis §5.4, Figs. 5.3–5.4).

Images: 16 grey-scale natural images bundled with scikit-image (`skimage.data`: camera, astronaut, coins,
moon, text, brick, grass, gravel, chelsea, coffee, rocket, clock, page, hubble_deep_field,
immunohistochemistry, cell), colour converted to grey, centre-cropped to a square, down-sampled to
size × size (64 × 64 in the thesis, D = 4096) and mapped linearly to [−1, 1]. (The thesis used a collection
"frequently used by the vision community"; these are different images.)

Model: N(y | Mw, ν²I) with ν² = 0.005 and Laplace potentials on B w, B = [periodic finite differences
(τ = 0.1); orthonormal Daubechies-4 wavelets (τ = 0.14)] (B ∈ R^{3D×D}). Start: N_0 random unit-norm rows;
each step adds 3 rows: the leading eigenvectors of the posterior covariance (Lanczos) for G-KL with a chevron
Cholesky factor of K rows and for LVB (``vj.LVB(variances="lanczos", num_lanczos=80)``: P never formed, the
variances from 80 Lanczos vectors, as glm-ie; "LVB exact" forms P); 3 random unit-norm rows for MAP
(`MAP Rand`). For LVB the Lanczos estimates are compared with exact variances once, at the first image's last
fit. Reports ℓ2 errors
against N (mean ± s.e. over images), reconstructions at several budgets, and time per design step.

    python benchmarks/design_images.py                                  # the thesis's sizes
    python benchmarks/design_images.py --size 32 --images 2 --start 50 --steps 6 --chevron 20 --tag reduced
    # time per design step at 64 × 64 (fits at N, N + 3, N + 6: cold with compilation, warm with
    # compilation, then compiled and warm-started), one method at a time:
    python benchmarks/design_images.py --images 1 --start 100 --steps 2 --methods G-KL --tag gkl64_n100
    python benchmarks/design_images.py --images 1 --start 100 --steps 2 --methods LVB --tag lvb64_n100
    python benchmarks/design_images.py --images 1 --start 2042 --steps 2 --methods G-KL --tag gkl64_n2048
    python benchmarks/design_images.py --images 1 --start 100 --steps 2 --methods G-KL --gkl-tol 1e-10 --tag gkl64_n100_tol10
    # G-KL runs at the design loop's default Newton tolerance, vj.design.FIT_TOL = 1e-6 (--gkl-tol overrides).
    # All 16 images, one process per image (each can run on its own core), then merged:
    python benchmarks/design_images.py --image-index 0 --save-means --no-lanczos-check --tag part0   # … to 15
    python benchmarks/design_images.py --combine part0,part1,…,part15 --tag all16
    # the reduced 16-image protocol run here (16 × 16 pixels, N = 25 → 55 in blocks of 10):
    python benchmarks/design_images.py --size 16 --images 16 --start 25 --steps 3 --rows 10 --chevron 20 --lanczos 20 \
        --no-lanczos-check --save-means --tag 16img_16px

Two more modes, on the same images and seeds:

- ``--paired TAG [TAG ...]``: a paired per-image comparison of earlier runs (``results/design_images_<tag>.json``;
  every run draws image i's starting rows, noise and random-design keys from i alone, so runs of different
  methods or settings on the same images are paired). For each method of each run, the ℓ2 error at every N
  (mean ± s.e. over images) and its paired difference at the last N from ``--baseline`` (default MAP Rand of the
  first run): mean ± s.e. and on how many images the method is lower. Saved as
  ``design_images_paired_<tag>.txt`` with ``--tag``.
- ``--lvb-design-check``: where LVB with Lanczos variances (``--lanczos`` vectors, ``--lvb-iter`` loops) loses
  against exact LVB. On each image it fits both to the same N0 rows and separates the fit (the ℓ2 error of each
  mean, the share of tr P⁻¹ the Lanczos vectors hold) from the design: the free-design block of ``--rows`` rows
  chosen from each posterior, scored by its information gain under the *exact* LVB posterior, and the ℓ2 error
  of the refits after measuring that block (and, for reference, ``--rows`` random unit-norm rows). Saved as
  ``design_lvb_lanczos_<tag>.txt`` and ``.json``.

    python benchmarks/design_images.py --paired 16img_16px 16px_lvbexact 16px_lvb20_it300 --tag lvb_16px
    python benchmarks/design_images.py --lvb-design-check --size 16 --images 8 --start 25 --rows 10 --lanczos 20 \
        --tag 16px_k20
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee, mean_se, plot_error_curves  # noqa: E402

NU2 = 0.005
IMAGES = ["camera", "astronaut", "coins", "moon", "text", "brick", "grass", "gravel", "chelsea", "coffee", "rocket",
          "clock", "page", "hubble_deep_field", "immunohistochemistry", "cell"]
THESIS_SECONDS = {"G-KL": {"first": 30.0, "N=2048": 60.0}, "LVB": {"first": 5.0, "N=2048": 25.0}}


def image_prior(shape):
    """The thesis's image model: B = [periodic finite differences; Daubechies-4 wavelets] with Laplace
    potentials of scale 0.1 and 0.14. Returns (B, the prior potential, the wavelet operator)."""
    fd = vj.design.filters.finite_differences(shape, periodic=True)
    wav = vj.design.filters.wavelets(shape)
    tau = jnp.concatenate([jnp.full(fd.shape[0], 0.1), jnp.full(wav.shape[0], 0.14)])
    return vj.design.filters.stack(fd, wav), vj.potentials.Laplace(scale=tau), wav


def load_image(name, size):
    import skimage.color
    import skimage.data
    import skimage.transform

    image = getattr(skimage.data, name)()
    if image.ndim == 3:
        image = skimage.color.rgb2gray(image[..., :3])
    image = image.astype(float)
    h, w = image.shape
    n = min(h, w)
    image = image[(h - n) // 2:(h - n) // 2 + n, (w - n) // 2:(w - n) // 2 + n]
    small = skimage.transform.resize(image, (size, size), anti_aliasing=True)
    lo, hi = small.min(), small.max()
    return 2 * (small - lo) / (hi - lo) - 1


def measurements(w, i, num):
    """Image i's ``num`` starting rows (random, unit norm) and their noisy measurements of ``w``."""
    rng = np.random.default_rng(100 + i)
    M = rng.normal(size=(num, w.size))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    return M, M @ w + np.sqrt(NU2) * rng.normal(size=num)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--start", type=int, default=100)
    parser.add_argument("--steps", type=int, default=650, help="designed blocks of 3 rows (thesis: to N ≈ 2048)")
    parser.add_argument("--rows", type=int, default=3, help="designed rows per step (thesis: 3)")
    parser.add_argument("--chevron", type=int, default=80)
    parser.add_argument("--lanczos", type=int, default=80, help="Lanczos vectors of LVB's variance estimates")
    parser.add_argument("--lvb-probes", type=int, default=1,
                        help="LVB's probes for its log_z estimate (vj.LVB's default 8; the loop never reads log_z)")
    parser.add_argument("--lvb-iter", type=int, default=30, help="LVB's outer (variance) iterations at most")
    parser.add_argument("--gkl-tol", type=float, default=None,
                        help="G-KL's Newton-CG tolerance on the squared Newton decrement, sequential's `fit_tol` "
                             "(default: the design loop's, vj.design.FIT_TOL = 1e-6; 1e-10 is the solver's own)")
    parser.add_argument("--image-index", default=None,
                        help="comma-separated indices into the image list to run (default: the first --images); "
                             "with --save-means, one process per image can run in parallel and --combine merges them")
    parser.add_argument("--no-lanczos-check", action="store_true", help="skip the exact-variance check (O(D³))")
    parser.add_argument("--save-means", action="store_true", help="also save each fit's mean (.npz) for --combine")
    parser.add_argument("--combine", default=None,
                        help="comma-separated tags of earlier --save-means runs: merge their curves and plots under --tag")
    parser.add_argument("--methods", default="G-KL,LVB,MAP Rand")
    parser.add_argument("--tag", default="")
    parser.add_argument("--paired", nargs="+", default=None, metavar="TAG",
                        help="compare earlier runs (their tags) image by image, against --baseline")
    parser.add_argument("--baseline", default="MAP Rand", help="--paired: the method of the first run compared against")
    parser.add_argument("--lvb-design-check", action="store_true",
                        help="LVB Lanczos against exact LVB: fit and designed block, scored under the exact posterior")
    args = parser.parse_args()
    name = "design_images" + (f"_{args.tag}" if args.tag else "")
    if args.combine:
        return combine(args, name)
    if args.paired:
        return paired(args)
    if args.lvb_design_check:
        return lvb_design_check(args)
    log = Tee()
    shape = (args.size, args.size)
    D = args.size**2
    B, prior, wav = image_prior(shape)
    fit_tol = {} if args.gkl_tol is None else {"fit_tol": args.gkl_tol}
    methods = {"G-KL": (vj.GKL(covariance=vj.covariance.Chevron(args.chevron)), "free"),
               "LVB": (vj.LVB(variances="lanczos", num_lanczos=args.lanczos, tol=1e-2, max_iter=args.lvb_iter,
                           num_probes=args.lvb_probes), "free"),
               "LVB exact": (vj.LVB(), "free"), "MAP Rand": (vj.MAP(), "random")}
    methods = {k: v for k, v in methods.items() if k in args.methods.split(",")}
    log(f"# {name}: {args.images} images of {shape} (D={D}), B = periodic finite differences + db4 wavelets "
        f"({wav.levels} levels), N0={args.start}, {args.steps} steps of {args.rows} rows, chevron K={args.chevron}, "
        f"nu2={NU2}; methods {list(methods)}")
    indices = (list(range(args.images)) if args.image_index is None
               else [int(i) for i in args.image_index.split(",")])
    images = [IMAGES[i] for i in indices]
    results = {"args": vars(args), "images": images, "curves": {}, "times": {}, "means": {}, "errors": {},
               "fit_tol": args.gkl_tol if args.gkl_tol is not None else vj.design.FIT_TOL}
    truths = []
    for label, (method, design) in methods.items():
        errs, times, means, cpu = [], [], [], []
        for i, image_name in zip(indices, images):
            w = load_image(image_name, args.size).ravel()
            if len(truths) < len(images):
                truths.append(w)
            M, y = measurements(w, i, args.start)
            r = vj.design.sequential(M, y, NU2, B, prior, method, args.steps, rows_per_step=args.rows, design=design,
                                     truth=w, key=jax.random.PRNGKey(i), keep_means=True, **fit_tol)
            if i == indices[0] and label == "LVB" and not args.no_lanczos_check:
                results["lanczos_variance_error"] = lanczos_error(r.posterior, log)
            errs.append(r.errors)
            times.append(r.fit_times + np.concatenate([[0.0], r.design_times]))
            cpu.append(r.fit_cpu_times)
            means.append(r.means)
            log(f"{label:9s} {image_name:22s} error {r.errors[0]:.2f} (N={r.num_measurements[0]}) -> "
                f"{r.errors[-1]:.2f} (N={r.num_measurements[-1]}); step times first {times[-1][0]:.1f} s "
                f"(with compilation), last {times[-1][-1]:.1f} s; design seconds "
                f"{', '.join(f'{t:.2f}' for t in r.design_times)}; fit CPU seconds (all threads) "
                f"{', '.join(f'{c:.1f}' for c in r.fit_cpu_times)}; iterations "
                f"{int(r.posterior.diagnostics.iterations)} at the last fit; converged {int(r.converged.sum())}/{len(r.converged)}")
        errs, times = np.array(errs), np.array(times)
        results["errors"][label] = errs.tolist()
        results["curves"][label] = {"N": r.num_measurements.tolist(), "mean": errs.mean(0).tolist(),
                                    "se": (errs.std(0, ddof=1) / np.sqrt(len(errs))).tolist() if len(errs) > 1
                                    else [float("nan")] * errs.shape[1]}
        later = times[:, 1:] if times.shape[1] > 1 else times
        cpu = np.array(cpu)
        results["times"][label] = {"first_fit_s": mean_se(times[:, 0]), "later_step_s": mean_se(later.ravel()),
                                   "fit_cpu_s_first": mean_se(cpu[:, 0]), "fit_cpu_s_last": mean_se(cpu[:, -1]),
                                   "last_step_s": mean_se(times[:, -1]), "thesis_s": THESIS_SECONDS.get(label)}
        log(f"{label:9s} time per step: first {mean_se(times[:, 0])[0]:.1f} s (compilation included), later "
            f"{mean_se(later.ravel())[0]:.2f} s, at N={r.num_measurements[-1]} {mean_se(times[:, -1])[0]:.2f} s; "
            f"thesis {THESIS_SECONDS.get(label)}")
        results["means"][label] = np.array(means)
        save(results, truths, log, name, args.save_means)  # after each method: a run cut short keeps what it did
    means = results["means"]
    plot_errors(results, RESULTS / f"{name}_errors.png")
    plot_reconstructions(means, np.array(truths), results["curves"], shape, RESULTS / f"{name}_reconstructions.png")


def save(results, truths, log, name, save_means):
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({k: v for k, v in results.items() if k != "means"}, indent=1))
    log.save(name)
    if save_means:
        np.savez_compressed(RESULTS / f"{name}_means.npz", truths=np.array(truths),
                            **{label.replace(" ", "_"): m for label, m in results["means"].items()})


def combine(args, name):
    """Merge per-image runs (``--save-means``, one tag each) into one set of curves, a table and the plots."""
    log = Tee()
    parts = [json.loads((RESULTS / f"design_images_{t}.json").read_text()) for t in args.combine.split(",")]
    npz = [np.load(RESULTS / f"design_images_{t}_means.npz") for t in args.combine.split(",")]
    # A method may come from some of the runs only (e.g. MAP Rand in larger random steps, on its own N grid):
    # each method is merged over the runs that have it, which must cover the same images in the same order.
    labels = list(dict.fromkeys(label for p in parts for label in p["curves"]))
    having = {label: [i for i, p in enumerate(parts) if label in p["curves"]] for label in labels}
    images = [im for i in having[labels[0]] for im in parts[i]["images"]]
    for label in labels:
        if [im for i in having[label] for im in parts[i]["images"]] != images:
            raise SystemExit(f"--combine: {label} was run on other images than {labels[0]}")
    log(f"# {name}: {len(images)} images ({', '.join(images)}) merged from runs {args.combine}; "
        f"settings of the first: {parts[0]['args']}")
    curves, errors, times = {}, {}, {}
    for label in labels:
        errs = np.array([e for i in having[label] for e in parts[i]["errors"][label]])
        N = parts[having[label][0]]["curves"][label]["N"]
        errors[label] = errs.tolist()
        curves[label] = {"N": N, "mean": errs.mean(0).tolist(),
                         "se": (errs.std(0, ddof=1) / np.sqrt(len(errs))).tolist()}
        times[label] = {key: mean_se([parts[i]["times"][label][key][0] for i in having[label]])
                        for key in ("first_fit_s", "later_step_s", "last_step_s", "fit_cpu_s_first", "fit_cpu_s_last")}
        log(f"{label:9s} l2 error over {len(errs)} images: " + ", ".join(
            f"N={n}: {m:.2f} ± {e:.2f}" for n, m, e in zip(N, curves[label]["mean"], curves[label]["se"])))
        log(f"{label:9s} mean per-process times (s): " + ", ".join(f"{k} {v[0]:.1f}" for k, v in times[label].items()))
    if "MAP Rand" in labels:
        for label in labels:
            if label == "MAP Rand":
                continue
            shared = [n for n in curves[label]["N"] if n in curves["MAP Rand"]["N"]]
            for n in shared[1:] if len(shared) > 1 else shared:
                diff = (np.array(errors["MAP Rand"])[:, curves["MAP Rand"]["N"].index(n)]
                        - np.array(errors[label])[:, curves[label]["N"].index(n)])
                log(f"{label} against MAP Rand at N={n}: designed lower on {int(np.sum(diff > 0))}/{len(diff)} "
                    f"images, mean difference {diff.mean():.2f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.2f}")
    results = {"args": vars(args), "images": images, "curves": curves, "errors": errors, "times": times,
               "parts": args.combine.split(",")}
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))
    log.save(name)
    plot_errors({"curves": curves, "images": images, "args": parts[0]["args"]}, RESULTS / f"{name}_errors.png")
    means = {label: np.concatenate([npz[i][label.replace(" ", "_")] for i in having[label]]) for label in labels}
    truths = np.concatenate([npz[i]["truths"] for i in having[labels[0]]])
    size = parts[0]["args"]["size"]
    plot_reconstructions(means, truths, curves, (size, size), RESULTS / f"{name}_reconstructions.png", num_images=4)


def paired(args):
    """``--paired``: per-image differences between earlier runs on the same images (module docstring)."""
    runs = {t: json.loads((RESULTS / f"design_images_{t}.json").read_text()) for t in args.paired}
    first = runs[args.paired[0]]
    images = first["images"]
    base = np.array(first["errors"][args.baseline])
    N = first["curves"][args.baseline]["N"]
    log = Tee()
    log(f"# paired over {len(images)} images ({', '.join(images)}); baseline {args.baseline} of run {args.paired[0]}; "
        f"N = {N}")
    for tag, run in runs.items():
        if run["images"] != images:
            raise SystemExit(f"run {tag} has other images ({run['images']}): not paired")
        for label, errs in run["errors"].items():
            errs = np.array(errs)
            a = run["args"]
            setting = f"lanczos {a.get('lanczos')}, <= {a.get('lvb_iter')} loops" if label == "LVB" else ""
            err = "  ".join(f"{m:.2f} ± {s:.2f}" for m, s in (mean_se(errs[:, k]) for k in range(errs.shape[1])))
            log(f"{tag:18s} {label:9s} {setting:26s} error {err}")
            if label == args.baseline and tag == args.paired[0]:
                continue
            m, s = mean_se(base[:, -1] - errs[:, -1])
            lower = int(np.sum(base[:, -1] > errs[:, -1]))
            log(f"{'':18s} {'':9s} {'':26s} {args.baseline} − {label} at N={N[-1]}: {m:+.2f} ± {s:.2f}, lower on "
                f"{lower}/{len(errs)} images")
    if args.tag:
        log.save(f"design_images_paired_{args.tag}")


def lvb_design_check(args):
    """``--lvb-design-check``: LVB with Lanczos variances against exact LVB, fit and design apart (module docstring)."""
    name = "design_lvb_lanczos" + (f"_{args.tag}" if args.tag else "")
    D = args.size**2
    B, prior, _ = image_prior((args.size, args.size))
    exact = vj.LVB()
    approx = vj.LVB(variances="lanczos", num_lanczos=args.lanczos, tol=1e-2, max_iter=args.lvb_iter, num_probes=1)
    log = Tee()
    log(f"# {name}: {args.images} images ({args.size}, {args.size}), N0={args.start}, block of {args.rows} rows, LVB "
        f"exact against LVB Lanczos k={args.lanczos} (tol 1e-2, <= {args.lvb_iter} loops), nu2={NU2}")
    keys = ["err_exact", "err_lanczos", "share", "gain_exact_design", "gain_lanczos_design", "gain_random",
            "refit_exact_design", "refit_lanczos_design", "refit_random", "lanczos_refit_exact_design",
            "lanczos_refit_lanczos_design"]
    table = {k: [] for k in keys}
    for i, image in enumerate(IMAGES[:args.images]):
        w = load_image(image, args.size).ravel()
        M, y = measurements(w, i, args.start)
        model = vj.design.sparse_linear_model(M, y, NU2, B, prior)
        pe, pl = vj.infer(model, exact), vj.infer(model, approx)
        key = jax.random.PRNGKey(i)
        blocks = {"exact_design": np.asarray(vj.design.free_design(pe, args.rows, key=key)[0]),
                  "lanczos_design": np.asarray(vj.design.free_design(pl, args.rows, key=key)[0]),
                  "random": np.asarray(vj.design.random_rows(key, args.rows, D))}
        noise = np.sqrt(NU2) * np.random.default_rng(500 + i).normal(size=args.rows)  # the same noise for every block

        def refit(method, new, init):
            more = vj.design.sparse_linear_model(np.concatenate([M, new]), np.concatenate([y, new @ w + noise]), NU2, B,
                                                 prior)
            return float(np.linalg.norm(np.asarray(vj.infer(more, method, init=init).mean) - w))

        row = {"err_exact": float(np.linalg.norm(np.asarray(pe.mean) - w)),
               "err_lanczos": float(np.linalg.norm(np.asarray(pl.mean) - w)),
               "share": float(pl.diagnostics.info.variance_fraction)}
        for k, rows in blocks.items():
            row[f"gain_{k}"] = float(vj.design.information_gain(pe, rows, NU2))
            row[f"refit_{k}"] = refit(exact, rows, pe)
            if k != "random":
                row[f"lanczos_refit_{k}"] = refit(approx, rows, pl)
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


def lanczos_error(post, log):
    """LVB's Lanczos variance estimates at its last fit against the exact marginal variances at the same ξ.

    P = Σ_n A_n h_n h_nᵀ is formed once, column by column from its products (D products), and factorised,
    so this costs O(D³) once; the fit itself never forms it.
    """
    from vijax.methods import _gaussian, lvb

    model = post.model
    xi = lvb._update(model, "jaakkola", post.mean, post.factor)
    k = int(post.diagnostics.info.num_lanczos)
    quadratics = lvb._quadratics(xi, model, "jaakkola")
    product, _, _ = _gaussian.precision_operator(model, quadratics)
    D = model.dim
    P = np.asarray(jax.jit(jax.vmap(product, in_axes=1, out_axes=1))(jnp.eye(D)))
    L = np.linalg.cholesky(0.5 * (P + P.T))
    Linv = np.linalg.inv(L)  # diag(P⁻¹) = column sums of L⁻¹ squared (a benchmark check, not the library)
    exact = np.sum(Linv**2, axis=0)
    v0 = jax.random.rademacher(jax.random.PRNGKey(0), (D,), jnp.float64)
    estimate = np.asarray(vj.design.lanczos_variances(product, D, k, v0=v0)[0])
    ratio = estimate / exact
    lam = np.linalg.eigvalsh(P)  # ascending: the k smallest are S's k largest variances
    best = float(np.sum(1 / lam[:k]) / np.sum(1 / lam))  # the share any rank-k estimate could hold at best
    out = {"num_vectors": k, "median_ratio": float(np.median(ratio)), "min_ratio": float(ratio.min()),
           "max_ratio": float(ratio.max()), "captured_share": float(np.sum(estimate) / np.sum(exact)),
           "reported_share": float(post.diagnostics.info.variance_fraction), "k_over_D": k / D,
           "best_rank_k_share": best, "P_condition": float(lam[-1] / lam[0])}
    log(f"Lanczos variance estimates ({k} vectors, D={D}) against the exact marginals of P at LVB's last ξ: "
        f"estimate/exact median {out['median_ratio']:.3f} (min {out['min_ratio']:.3g}, max {out['max_ratio']:.3f}); "
        f"share of the total variance {out['captured_share']:.3f} (LVBInfo.variance_fraction reported "
        f"{out['reported_share']:.3f}; k/D = {k / D:.3f}; S's top-{k} eigenvalues hold {best:.3f}); "
        f"cond(P) {out['P_condition']:.3g}")
    return out


def plot_errors(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    plot_error_curves(ax, results["curves"], f"{len(results['images'])} images, D = {results['args']['size'] ** 2}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_reconstructions(means, truths, curves, shape, path, num_images=2, num_budgets=4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(means)
    shared = [n for n in curves[labels[0]]["N"] if all(n in curves[label]["N"] for label in labels)]  # budgets all have
    budgets = [shared[k] for k in np.unique(np.linspace(0, len(shared) - 1, num_budgets).astype(int))]
    num_images = min(num_images, len(truths))
    fig, axes = plt.subplots(num_images * len(labels), len(budgets) + 1,
                             figsize=(1.6 * (len(budgets) + 1), 1.6 * num_images * len(labels)), squeeze=False)
    for i in range(num_images):
        for j, label in enumerate(labels):
            row = axes[i * len(labels) + j]
            for k, n in enumerate(budgets):
                row[k].imshow(means[label][i, curves[label]["N"].index(n)].reshape(shape), cmap="gray", vmin=-1, vmax=1)
                row[k].set_title(f"{label} N={n}", fontsize=6)
            row[-1].imshow(truths[i].reshape(shape), cmap="gray", vmin=-1, vmax=1)
            row[-1].set_title("true", fontsize=6)
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
