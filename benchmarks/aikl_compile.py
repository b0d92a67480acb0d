"""AI-KL compile diagnosis at D = N = 10 (Fig. 6.4 problem, model 0): for each of its two programs (the start,
a G-KL fit, and the AI-KL fit), how many times `aikl.bound` is traced, the lowered text size, and compile time.

Run: python benchmarks/aikl_compile.py [K]
"""
import importlib
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)
import vijax as vj  # noqa: E402
from vijax.methods import aikl  # noqa: E402

B = importlib.import_module("aikl")

K = int(sys.argv[1]) if len(sys.argv) > 1 else 64
model, _ = B.logistic_problem(np.random.default_rng(1000 * 10 + 0), 10, 100)
method = vj.AIKL(base=aikl.SkewNormal(), lattice_points=K)
calls = {"n": 0}
_bound = aikl.bound


def counting(*a, **k):
    calls["n"] += 1
    return _bound(*a, **k)


aikl.bound = counting


def lower(name, fn, *args):
    calls["n"] = 0
    t = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t_lower = time.perf_counter() - t
    text = lowered.as_text()
    t = time.perf_counter()
    lowered.compile()
    t_compile = time.perf_counter() - t
    print(f"{name:6s} bound traced {calls['n']:2d}  lowered {len(text) / 1e3:8.1f} kB  "
          f"trace+lower {t_lower:6.2f} s  compile {t_compile:6.2f} s", flush=True)
    return len(text)


state = method.start(model)
sizes = [lower("start", method.init_state, model), lower("fit", method.solve, model, state)]
print(f"total lowered {sum(sizes) / 1e3:.1f} kB")
calls["n"] = 0
lowered = jax.jit(jax.value_and_grad(lambda p: _bound(p, model, method.base, K))).lower(state.params)
print(f"bound value_and_grad alone: lowered {len(lowered.as_text()) / 1e3:.1f} kB")
