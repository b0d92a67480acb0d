"""AI-KL vs G-KL time at D = N = 10 (Fig. 6.4 problem N = 10, model 0): first call and warm, one run.

Run: python benchmarks/aikl_speed.py [K ...] [--tol TOL] [--scheme joint|blockwise ...] [--models M]
(default: the AIKL defaults). G-KL is timed in the same process, first call and warm (median of 5),
so the ratio is taken under the same machine load; the load average and CPU seconds are printed.
``--models M``: afterwards, the warm times (median of 3, CPU seconds too) of both methods on the
Fig. 6.4 models 0 … M−1 at N = 10 (model 0 is the one above) and the median of their ratios.
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
parser.add_argument("--models", type=int, default=0)
args = parser.parse_args()
model, test = B.logistic_problem(np.random.default_rng(1000 * 10 + 0), 10, 100)


def timed(fn, repeats=5, cpu=False):
    t = time.perf_counter(); out = jax.block_until_ready(fn()); first = time.perf_counter() - t
    warm, warm_cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(fn())
        warm.append(time.perf_counter() - t); warm_cpu.append(time.process_time() - c)
    if cpu:
        return out, first, float(np.median(warm)), float(np.median(warm_cpu))
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
if args.models:
    m = vj.AIKL(base=aikl.SkewNormal(), **({} if not args.K else dict(lattice_points=args.K[0])))
    ratios, cpu_ratios = [], []
    for k in range(args.models):
        model, _ = B.logistic_problem(np.random.default_rng(1000 * 10 + k), 10, 100)
        _, _, g2, gc = timed(lambda: vj.infer(model, vj.GKL()), repeats=3, cpu=True)
        p, _, t2, tc = timed(lambda: vj.infer(model, m), repeats=3, cpu=True)
        ratios.append(t2 / g2); cpu_ratios.append(tc / gc)
        print(f"model {k}: G-KL warm {g2:.4f}s (cpu {gc:.4f}s) AI-KL warm {t2:.3f}s (cpu {tc:.3f}s) ratio {t2 / g2:.0f}x "
              f"(cpu {tc / gc:.0f}x) iters {int(p.diagnostics.iterations)} dB {float(p.log_z) - float(p.diagnostics.info.gaussian_log_z):.4f}",
              flush=True)
    print(f"median warm ratio over {args.models} models: {np.median(ratios):.0f}x (cpu {np.median(cpu_ratios):.0f}x)")
print(f"load average {os.getloadavg()}")
