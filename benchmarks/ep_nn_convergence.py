"""Where `vj.nn.NetworkEP` fails to converge: the moment residual of each kind of site, every 100 iterations.

The loop of `NetworkEP` (damped parallel EP, heavy-ball momentum after ``MOMENTUM_AFTER``
iterations, restarted when the residual rises) with a damping per kind of site from iteration
``SWITCH`` on (before it, ``NetworkEP().damping`` for all), on a problem of ``benchmarks/ep_nn.py``
(K = 8, the MAP start). Kinds: h activations, p noise, w input-weight priors, s their scale sites,
pos positivity of v, v output weights. Prints the residuals and the units alive (E v_k > 0.1) every
100 iterations, and the test RMSE / mean log predictive density at the end.

Run: ``python benchmarks/ep_nn_convergence.py PROBLEM TAG ITERATIONS '{"s": 0.6, "w": 0.6}' [MOMENTUM]
[MOMENTUM_AFTER] [SWITCH]``; the residual trace goes to ``/tmp/ep_nn_convergence_PROBLEM_TAG.npz``.
Results (single-threaded XLA, shared machine): ``benchmarks/results/ep_nn_convergence.txt``.
"""
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import ep_nn  # noqa: E402  (sets x64)
import vijax as vj  # noqa: E402
from vijax._linalg import backtrack, select  # noqa: E402
from vijax.nn.network import _MAX_HALVINGS, NetworkSites, NetworkState  # noqa: E402

name, tag, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
damp = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
mom = float(sys.argv[5]) if len(sys.argv) > 5 else 0.7
after = int(sys.argv[6]) if len(sys.argv) > 6 else 200
switch = int(sys.argv[7]) if len(sys.argv) > 7 else 0  # the per-kind damping applies from this iteration
rng = np.random.default_rng(0)
data = {n: ep_nn.standardise(*split) for n, *split in ep_nn.problems(rng)}
Xtr, ytr, Xte, yte, sy = data[name]
net = vj.nn.TwoLayerNetwork(Xtr, ytr, num_hidden=8)
ep = vj.nn.NetworkEP()
kinds = dict(h_tau="h", h_nu="h", v_tau="v", v_nu="v", v_dir="v", noise_tau="p", noise_nu="p", w_tau="w", w_nu="w",
             scale_tau="s", scale_nu="s", pos_tau="pos", pos_nu="pos")
dvec = NetworkSites(*[damp.get(kinds[f], ep.damping) for f in NetworkSites._fields])
dbase = NetworkSites(*[ep.damping for f in NetworkSites._fields])
t0 = time.time()
sites = ep.start(net).sites
evaluate = eqx.filter_jit(lambda s: ep.evaluate(net, s))
ev = evaluate(sites)

@eqx.filter_jit
def body(k, sites, ev, previous):
    beta = jnp.where(k > after, mom, 0.0)
    step = jax.tree_util.tree_map(lambda d, p, dd, db: jnp.where(k > switch, dd, db) * d + beta * p, ev.step, previous, dvec, dbase)
    alpha, new, ok, _ = backtrack(lambda a: ep.evaluate(net, sites.add(step, a)), lambda a, new: new.proper,
                                  jnp.ones((), net.X.dtype), _MAX_HALVINGS, placeholder=ev)
    sites = select(ok, sites.add(step, alpha), sites)
    keep = ok & (new.residual <= ev.residual)
    previous = jax.tree_util.tree_map(lambda d: jnp.where(keep, alpha * d, 0.0), step)
    return sites, select(ok, new, ev), previous, ok

previous = jax.tree_util.tree_map(jnp.zeros_like, sites)
trace = []
for k in range(1, iters + 1):
    sites, ev, previous, ok = body(jnp.array(k), sites, ev, previous)
    r = np.asarray(ev.residuals)
    trace.append(r)
    if k % 100 == 0 or float(ev.residual) <= 1e-3 or not bool(ok):
        alive = int(np.sum(np.asarray(ev.q.v_mean[:-1]) > 0.1))
        print(k, f"{time.time()-t0:.0f}s", "res", f"{float(ev.residual):.3g}", "kinds[h,p,w,s,pos,v]", np.array2string(r, precision=2), "alive", alive, flush=True)
        np.savez(f"/tmp/ep_nn_convergence_{name}_{tag}.npz", trace=np.array(trace))
    if float(ev.residual) <= 1e-3 or not bool(ok):
        break
# Test metrics at the end, by the posterior of these sites (a fit from them that stops at once).
post = vj.nn.NetworkEP(tol=float("inf")).fit(net, NetworkState(sites, jnp.array(k)))
mean, _ = post.predict(Xte); lp = post.log_predictive(Xte, yte)
print("final", k, float(ev.residual), "rmse/lpd", ep_nn.metrics(np.asarray(mean), np.asarray(lp), yte, sy), flush=True)
