"""Cost of one value-and-gradient of the AI-KL bound at the Table 6.1 shape (Synthetic split 0: D = 100,
two groups of N = 100 Laplace sites, K = 64, GeneralisedNormal(1.5)), in one process:

- ``all``: every component's sampled density transformed (the evaluation before the wide-component
  selection; `aikl._wide_count` patched to return D);
- ``select``: the widest `_wide_count` = 27 components of each site only (`_SMALL_DIVISOR` = 1);
- ``default``: that, or the widest 13 when no site has more (the `lax.cond` of `_site_lattice`).

The point is the G-KL start with U perturbed (so A is dense). Prints the bound (equal in all three to
rounding), the CPU seconds (median of 7, after compilation), compile CPU seconds, XLA's cost analysis
and the load average. Run: python benchmarks/aikl_grad61.py
"""
import importlib, os, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import jax
import jax.numpy as jnp
import numpy as np
jax.config.update("jax_enable_x64", True)
import vijax as vj
from vijax.methods import aikl
B = importlib.import_module("aikl")
from _data import friedman_data

x, y = friedman_data(np.random.default_rng(0), 506)
perm = np.random.default_rng(0).permutation(len(y))
model, _, _ = B.kernel_problem(x, y, perm[:100], perm[100:])
frozen = jax.lax.stop_gradient(model)
base = aikl.GeneralisedNormal(eta=1.5)
start = vj.AIKL(base=base).to_state(frozen, vj.infer(model, vj.GKL())).params
rng = np.random.default_rng(1)
params = aikl.AIKLParams(start.loc, start.lower, start.upper + 0.01 * np.triu(rng.standard_normal((100, 100))), start.theta)
print(f"load average {os.getloadavg()}", flush=True)
wide_count, divisor = aikl._wide_count, aikl._SMALL_DIVISOR
for name in ("all", "select", "default"):
    aikl._wide_count = (lambda dim, k, span: dim) if name == "all" else wide_count
    aikl._SMALL_DIVISOR = 1 if name == "select" else divisor
    f = jax.jit(jax.value_and_grad(lambda p: aikl.bound(p, frozen, base, 64)))
    c = time.process_time()
    compiled = f.lower(params).compile()
    compile_cpu = time.process_time() - c
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    value, _ = jax.block_until_ready(f(params))
    times = []
    for _ in range(7):
        c = time.process_time()
        jax.block_until_ready(f(params))
        times.append(time.process_time() - c)
    print(f"{name:8s} bound {float(value):.12f}  value+grad cpu {np.median(times):.4f}s (min {min(times):.4f})  "
          f"compile cpu {compile_cpu:.1f}s  flops {cost.get('flops', 0) / 1e6:.0f}M  bytes {cost.get('bytes accessed', 0) / 1e6:.0f}M  "
          f"transcendentals {cost.get('transcendentals', 0) / 1e6:.2f}M", flush=True)
print(f"load average {os.getloadavg()}")
