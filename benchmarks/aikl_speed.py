"""AI-KL vs G-KL time at D = N = 10 (Fig. 6.4 problem N = 10, model 0): first call and warm, one run.

Run: python benchmarks/aikl_speed.py K TOL   (e.g. 256 1e-6, the default; 256 1e-8, the old default).
"""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import vijax as vj
from vijax.methods import aikl
import importlib; B = importlib.import_module("aikl")
K = int(sys.argv[1]); tol = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-8
model, test = B.logistic_problem(np.random.default_rng(1000 * 10 + 0), 10, 100)
g = vj.infer(model, vj.GKL())
t = time.perf_counter(); jax.block_until_ready(vj.infer(model, vj.GKL())); tg = time.perf_counter() - t
m = vj.AIKL(base=aikl.SkewNormal(), lattice_points=K, solver=vj.solvers.LBFGS(tol=tol, max_iter=1000))
t = time.perf_counter(); p = jax.block_until_ready(vj.infer(model, m)); t1 = time.perf_counter() - t
t = time.perf_counter(); p = jax.block_until_ready(vj.infer(model, m)); t2 = time.perf_counter() - t
info = p.diagnostics.info
print(f"K={K} tol={tol}: GKL {float(g.log_z):.4f} warm {tg:.4f}s | AIKL {float(p.log_z):.4f} first {t1:.1f}s warm {t2:.2f}s iters {int(p.diagnostics.iterations)} conv {bool(p.diagnostics.converged)} {info}")
