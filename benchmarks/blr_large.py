"""G-KL at the size of the thesis's large logistic regressions (Table 5.3), on sparse synthetic data.

A benchmark script, not a test. The LIBSVM sets of thesis §5.3 cannot be downloaded here, so this
script generates sparse data with their shapes and non-zero counts:

=========  =======  =======  ===========  =================================================
problem    D        N_trn    non-zeros    rows
=========  =======  =======  ===========  =================================================
a9a        123      16,000   ≈ 0.113 N D  binary features (value 1), ≈ 13.9 per row
realsim    20,958   36,000   3.7 M        unit-norm positive tf-idf-like rows, ≈ 103 per row
rcv1       42,736   50,000   7.3 M        unit-norm positive tf-idf-like rows, ≈ 146 per row
=========  =======  =======  ===========  =================================================

Columns are drawn with Zipf-like popularity p_d ∝ 1/(d + 10), as words in text are; duplicate
entries are summed. Labels follow the thesis's model p(y | x, w) = σ(τ y wᵀx) with w ~ N(0, I) and
τ = 1 (a9a) or 3 (realsim, rcv1); the inference model is the same, with H = τ y x as a BCOO matrix
(cost scales with the non-zeros). For each problem and family (Diagonal, and Chevron with the
thesis's K: 80, 100, 50) it fits G-KL with Newton-CG
to max|grad| < 0.1 (the thesis's tolerance), each in its own process, and reports the fit time
(compilation excluded, reported apart), iterations, the bound and the process's peak resident
memory. Target on a 2-core machine: every fit under 60 s and 8 GB.

Run (float64 unless --float32)::

    python benchmarks/blr_large.py                  # all three problems
    python benchmarks/blr_large.py --quick          # a9a and realsim
    python benchmarks/blr_large.py --problems rcv1 --families Chevron

Writes ``benchmarks/results/blr_large[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys

from _common import RESULTS, timed

PROBLEMS = {
    # name: (D, N, non-zeros or None for a density, density, binary values, tau, chevron K)
    "a9a": dict(dim=123, num=16_000, nnz=None, density=0.113, binary=True, tau=1.0, rank=80),
    "realsim": dict(dim=20_958, num=36_000, nnz=3_700_000, density=None, binary=False, tau=3.0, rank=100),
    "rcv1": dict(dim=42_736, num=50_000, nnz=7_300_000, density=None, binary=False, tau=3.0, rank=50),
}
TARGET_SECONDS, TARGET_GB = 60.0, 8.0


def make_data(spec, seed=0):
    """Sparse rows (BCOO arrays as numpy: data, (row, col) indices), labels and w_true."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dim, num = spec["dim"], spec["num"]
    nnz = spec["nnz"] or round(spec["density"] * dim * num)
    per_row = rng.poisson(nnz / num - 1, size=num) + 1
    rows = np.repeat(np.arange(num), per_row)
    popularity = 1.0 / (np.arange(dim) + 10.0)
    cols = rng.permutation(dim)[rng.choice(dim, size=rows.size, p=popularity / popularity.sum())]
    # Sum duplicate (row, col) pairs: a BCOO matrix must not hold repeated indices.
    key, inverse = np.unique(rows.astype(np.int64) * dim + cols, return_inverse=True)
    rows, cols = key // dim, key % dim
    if spec["binary"]:
        values = np.ones(key.size)
    else:
        values = np.bincount(inverse, weights=rng.gamma(1.0, 1.0, size=inverse.size))
        values /= np.sqrt(np.bincount(rows, weights=values**2, minlength=num))[rows]
    w_true = rng.normal(size=dim)
    activation = np.bincount(rows, weights=values * w_true[cols], minlength=num)
    y = np.where(rng.random(num) < 1 / (1 + np.exp(-spec["tau"] * activation)), 1.0, -1.0)
    return values, np.stack([rows, cols], axis=1), y, w_true


def run_one(problem, family, solver_name, float32):
    """One fit in this process; prints a JSON line."""
    import jax

    if not float32:
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import sparse as jsparse

    import vijax as vj

    spec = PROBLEMS[problem]
    dtype = jnp.float32 if float32 else jnp.float64
    values, indices, y, _ = make_data(spec)
    data = spec["tau"] * y[indices[:, 0]] * values
    H = jsparse.BCOO((jnp.asarray(data, dtype), jnp.asarray(indices, jnp.int32)), shape=(spec["num"], spec["dim"]),
                     indices_sorted=True, unique_indices=True)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(spec["dim"], 1.0), vj.Sites(H, vj.potentials.Logistic()))
    covariance = vj.covariance.Diagonal() if family == "Diagonal" else vj.covariance.Chevron(spec["rank"])
    solver = {"newton_cg": vj.solvers.NewtonCG(tol=0.1, max_iter=200)}[solver_name]
    fit = jax.jit(lambda m: vj.infer(m, vj.GKL(covariance=covariance, solver=solver)))
    compiled, (compile_seconds,) = timed(lambda: fit.lower(model).compile())
    post, (seconds,) = timed(compiled, model)
    d = post.diagnostics
    print("RESULT " + json.dumps(dict(
        problem=problem, family=family, solver=solver_name, nnz=int(values.size), seconds=seconds,
        compile_seconds=compile_seconds, iterations=int(d.iterations), grad_evals=int(d.num_grad_evals),
        hvp_evals=int(d.num_hvp_evals), converged=bool(d.converged), grad_norm=float(d.grad_norm),
        bound=float(post.log_z), peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        dtype=str(np.dtype(dtype)))), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a9a and realsim only")
    parser.add_argument("--problems", nargs="+", choices=sorted(PROBLEMS))
    parser.add_argument("--families", nargs="+", choices=["Diagonal", "Chevron"], default=["Diagonal", "Chevron"])
    parser.add_argument("--solvers", nargs="+", choices=["newton_cg"])
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--one", nargs=3, metavar=("PROBLEM", "FAMILY", "SOLVER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return run_one(*args.one, args.float32)

    problems = args.problems or (["a9a", "realsim"] if args.quick else list(PROBLEMS))
    solvers = args.solvers or ["newton_cg"]
    import jax

    print(f"jax {jax.__version__}, {platform.processor() or platform.machine()}, "
          f"{'float32' if args.float32 else 'float64'}; each fit in its own process")
    header = (f"{'problem':<8} {'family':<9} {'solver':<10} {'nnz':>9} {'fit s':>7} {'compile s':>9} {'iters':>5} "
              f"{'grads':>5} {'hvps':>5} {'conv':>5} {'bound':>12} {'peak GB':>8}  target")
    print(header + "\n" + "-" * len(header))
    rows = []
    for problem in problems:
        for family in args.families:
            for solver in solvers:
                command = [sys.executable, __file__, "--one", problem, family, solver] + (["--float32"] if args.float32 else [])
                run = subprocess.run(command, capture_output=True, text=True)
                lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
                if run.returncode or not lines:
                    print(f"{problem:<8} {family:<9} {solver:<10} FAILED: {run.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(lines[0][7:])
                rows.append(r)
                ok = r["seconds"] < TARGET_SECONDS and r["peak_gb"] < TARGET_GB and r["converged"]
                print(f"{problem:<8} {family:<9} {solver:<10} {r['nnz']:>9} {r['seconds']:>7.1f} {r['compile_seconds']:>9.1f} "
                      f"{r['iterations']:>5} {r['grad_evals']:>5} {r['hvp_evals']:>5} {str(r['converged']):>5} "
                      f"{r['bound']:>12.1f} {r['peak_gb']:>8.2f}  {'PASS' if ok else 'MISS'}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"blr_large{'_quick' if args.quick else ''}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
