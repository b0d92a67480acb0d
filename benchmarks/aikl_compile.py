"""AI-KL compile diagnosis at D = N = 10 (Fig. 6.4 problem, model 0): for each compiled stage of
`AIKL.staged_fit`, how many times `aikl.bound` is traced, the lowered text size, and compile time.

Run: python benchmarks/aikl_compile.py [K]
"""
import sys, time, importlib
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import vijax as vj
from vijax.methods import aikl
B = importlib.import_module("aikl")

K = int(sys.argv[1]) if len(sys.argv) > 1 else 256
model, _ = B.logistic_problem(np.random.default_rng(1000 * 10 + 0), 10, 100)
method = vj.AIKL(base=aikl.SkewNormal(), lattice_points=K)
frozen = jax.lax.stop_gradient(model)
calls = {"n": 0}
_bound = aikl.bound


def counting(*a, **k):
    calls["n"] += 1
    return _bound(*a, **k)


aikl.bound = counting
init = aikl._compiled_fit(vj.GKL(), frozen, None)
stage = aikl._compiled_stage


def lower(name, *args):
    calls["n"] = 0
    t = time.perf_counter()
    lowered = stage.lower(method, name, *args)
    t_lower = time.perf_counter() - t
    text = lowered.as_text()
    t = time.perf_counter()
    lowered.compile()
    t_compile = time.perf_counter() - t
    print(f"{name:10s} bound traced {calls['n']:2d}  lowered {len(text) / 1e3:8.1f} kB  "
          f"trace+lower {t_lower:6.2f} s  compile {t_compile:6.2f} s", flush=True)
    return len(text)


start, gaussian = stage(method, "_start", frozen, init)
sizes = [lower("_start", frozen, init)]
sizes.append(lower("_optimise", frozen, start, False))
sol, opt = stage(method, "_optimise", frozen, start, False)
for k in method._lattices()[1:3]:
    sizes.append(lower("_value", opt, frozen, k))
pairs = jax.numpy.stack([sol.value, stage(method, "_value", start, frozen, K)])
sizes.append(lower("_result", model, start, opt, sol, gaussian, jax.numpy.asarray(0), pairs, pairs[0]))
print(f"total lowered (one _value per extra K) {sum(sizes) / 1e3:.1f} kB")
# one value_and_grad of the bound alone
p = opt
calls["n"] = 0
lowered = jax.jit(jax.value_and_grad(lambda p: _bound(p, frozen, method.base, K))).lower(p)
print(f"bound value_and_grad alone: lowered {len(lowered.as_text()) / 1e3:.1f} kB")
f = jax.jit(jax.value_and_grad(lambda p: _bound(p, frozen, method.base, K)))
jax.block_until_ready(f(p))
t = time.perf_counter()
for _ in range(50):
    out = f(p)
jax.block_until_ready(out)
print(f"bound value_and_grad warm: {(time.perf_counter() - t) / 50 * 1e3:.2f} ms per call (K = {K})")
