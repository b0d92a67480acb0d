"""AI-KL vs G-KL time at D = N = 10 (Fig. 6.4 problem N = 10, model 0): first call and warm, one run.

Run: python benchmarks/aikl_speed.py [K ...] [--tol TOL] [--scheme joint|blockwise ...]
(default: the AIKL defaults). G-KL is timed in the same process, first call and warm (median of 5),
so the ratio is taken under the same machine load; the load average is printed.
"""
import argparse, os, sys, time, importlib
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import vijax as vj
from vijax.methods import aikl
B = importlib.import_module("aikl")

parser = argparse.ArgumentParser()
parser.add_argument("K", nargs="*", type=int)
parser.add_argument("--tol", type=float, default=None)
parser.add_argument("--scheme", nargs="*", default=[None])
args = parser.parse_args()
model, test = B.logistic_problem(np.random.default_rng(1000 * 10 + 0), 10, 100)


def timed(fn, repeats=5):
    t = time.perf_counter(); out = jax.block_until_ready(fn()); first = time.perf_counter() - t
    warm = []
    for _ in range(repeats):
        t = time.perf_counter(); out = jax.block_until_ready(fn()); warm.append(time.perf_counter() - t)
    return out, first, float(np.median(warm))


print(f"load average {os.getloadavg()}")
g, g1, g2 = timed(lambda: vj.infer(model, vj.GKL()))
print(f"GKL log_z {float(g.log_z):.4f} first {g1:.2f}s warm {g2:.4f}s", flush=True)
for K in args.K or [None]:
    for scheme in args.scheme:
        kw = {} if K is None else dict(lattice_points=K)
        if args.tol is not None:
            kw["solver"] = vj.solvers.LBFGS(tol=args.tol, max_iter=1000)
        if scheme is not None:
            kw["scheme"] = scheme
        m = vj.AIKL(base=aikl.SkewNormal(), **kw)
        p, t1, t2 = timed(lambda: vj.infer(model, m), repeats=3)
        info = p.diagnostics.info
        print(f"AIKL K={m.lattice_points} {kw.get('scheme', '')} log_z {float(p.log_z):.4f} first {t1:.1f}s warm {t2:.3f}s "
              f"(warm/GKL warm {t2 / g2:.0f}x) iters {int(p.diagnostics.iterations)} grads {int(p.diagnostics.num_grad_evals)} "
              f"conv {bool(p.diagnostics.converged)} {info}", flush=True)
print(f"load average {os.getloadavg()}")
