"""Seconds per `NetworkEP.evaluate` (one parallel EP pass: q, every cavity and tilted moment) against K.

n = 400 points of ``benchmarks/ep_nn.py``'s ``sim_relevance`` generator, K = 8, 16, 32 hidden units,
the random start; each evaluation compiled first, then the three sizes timed in turn, 20 rounds, so that
a change in the machine's load hits all three alike. Prints the minimum and median per K.

Run: ``python benchmarks/ep_nn_evaluate_time.py``; results in ``benchmarks/results/ep_nn_convergence.txt``.
"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import ep_nn  # noqa: E402  (sets x64)
import vijax as vj  # noqa: E402
rng = np.random.default_rng(3)
X, y = ep_nn.sim_relevance(rng, 400); y = (y - y.mean()) / y.std()
runs = {}
for K in (8, 16, 32):
    net = vj.nn.TwoLayerNetwork(X, y, num_hidden=K); ep = vj.nn.NetworkEP(init="random")
    s = ep.start(net).sites; ev = eqx.filter_jit(ep.evaluate); jax.block_until_ready(ev(net, s))
    runs[K] = (ev, net, s, [])
for _ in range(20):
    for K, (ev, net, s, ts) in runs.items():
        t = time.perf_counter(); jax.block_until_ready(ev(net, s)); ts.append(time.perf_counter() - t)
for K, (*_, ts) in runs.items():
    print(f"K={K}: evaluate min {min(ts)*1e3:.0f} ms, median {np.median(ts)*1e3:.0f} ms")
