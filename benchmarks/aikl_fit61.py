"""One Table 6.1 fit (Synthetic, Boston or Concrete, split 0, N_trn = 100: D = 100, 200 Laplace sites), timed,
with the optimiser's progress: how many iterations the bound needed to come within 1, 0.1, 0.01,
10⁻³ and 10⁻⁴ of its final value (the lattice error at K = 64 is about 10⁻³ here).

Run: python benchmarks/aikl_fit61.py [--data Synthetic|Boston|Concrete] [--K 64] [--tol 1e-6] [--eta 1.5] [--warm] [--window W]
Prints the load average and the wall and CPU seconds of the whole fit (first call, with compilation) and,
with ``--warm``, of a second fit of the same problem (compiled: the cost of each further Table 6.1 split).
"""
import argparse, importlib, os, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import vijax as vj
from vijax.methods import aikl
B = importlib.import_module("aikl")
from _data import friedman_data

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="Synthetic")
parser.add_argument("--K", type=int, default=64)
parser.add_argument("--tol", type=float, default=None)
parser.add_argument("--eta", type=float, default=1.5)
parser.add_argument("--warm", action="store_true")
parser.add_argument("--window", type=int, default=None, help="the solver's gain_window (default: AIKL's solver)")
args = parser.parse_args()
x, y = {"Synthetic": lambda: friedman_data(np.random.default_rng(0), 506), "Boston": B.boston,
        "Concrete": B.concrete}[args.data]()
perm = np.random.default_rng(0).permutation(len(y))
model, _, _ = B.kernel_problem(x, y, perm[:100], perm[100:])
kw = {} if args.tol is None else dict(solver=vj.solvers.LBFGS(tol=args.tol, max_iter=1000))
if args.window is not None:
    kw = dict(solver=vj.solvers.LBFGS(tol=args.tol or 1e-6, max_iter=1000, gain_tol=1e-3, gain_window=args.window))
method = vj.AIKL(base=aikl.GeneralisedNormal(eta=args.eta), lattice_points=args.K, **kw)
print(f"{args}; load average {os.getloadavg()}", flush=True)
gkl = jax.block_until_ready(vj.infer(model, vj.GKL()))
t, c = time.perf_counter(), time.process_time()
post = jax.block_until_ready(vj.infer(model, method, init=gkl))
t, c = time.perf_counter() - t, time.process_time() - c
d = post.diagnostics
print(f"fit (first call, with compilation): wall {t:.1f}s cpu {c:.1f}s; G-KL {float(gkl.log_z):.4f} AI-KL "
      f"{float(post.log_z):.4f}; iters {int(d.iterations)} grads {int(d.num_grad_evals)} conv {bool(d.converged)} "
      f"{d.info}", flush=True)
n = int(d.iterations)
tr = np.asarray(d.objective_trace)[:n + 1]
f = tr[-1]
need = {e: int(np.argmax(f - tr < e)) for e in (1.0, 0.1, 1e-2, 1e-3, 1e-4)}
print(f"optimisation: start {tr[0]:.4f} final (K = {args.K}) {f:.4f}; iterations to come within {need}", flush=True)
if args.warm:
    t, c = time.perf_counter(), time.process_time()
    gkl = jax.block_until_ready(vj.infer(model, vj.GKL()))
    tg, cg = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    again = jax.block_until_ready(vj.infer(model, method, init=gkl))
    t, c = time.perf_counter() - t, time.process_time() - c
    print(f"second fit (compiled): wall {t:.1f}s cpu {c:.1f}s, iters {int(again.diagnostics.iterations)}, "
          f"AI-KL {float(again.log_z):.4f}; G-KL fit wall {tg:.2f}s cpu {cg:.2f}s", flush=True)
print(f"load average {os.getloadavg()}")
