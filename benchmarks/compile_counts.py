"""Programs XLA builds for each method: a cold fit, new data of the same shapes, a warm refit, new settings,
and a warm start from another method's posterior (the table of the execution-model issue).

A benchmark script, not a test (`tests/test_execution.py` asserts the same bounds). Every program XLA builds,
compiled or loaded from a persistent cache, fires JAX's backend-compile event; a listener counts them.
Logistic regression N = 40, D = 3 (new data: another draw of the same shapes); "settings" refits with a new
tolerance or damping of the same structure; "from Laplace" starts from a Laplace posterior.

Run::

    python benchmarks/compile_counts.py

Writes ``benchmarks/results/compile_counts.txt``.
"""

from __future__ import annotations

import time
import warnings

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import Tee  # noqa: E402

_BUILT = [0, 0.0]


def _count(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _BUILT[0] += 1
        _BUILT[1] += duration


jax.monitoring.register_event_duration_secs_listener(_count)
NG, GN = vj.solvers.NewtonCG, vj.solvers.GaussNewton
cov = vj.covariance
# name: (method, (two configurations that differ only in settings))
METHODS = {
    "G-KL (default)": (vj.GKL(), (vj.GKL(), vj.GKL(tol=1e-9))),
    "G-KL diagonal": (vj.GKL(covariance=cov.Diagonal()),
                      (vj.GKL(covariance=cov.Diagonal()), vj.GKL(covariance=cov.Diagonal(), tol=1e-8))),
    "EP": (vj.EP(), (vj.EP(damping=0.8), vj.EP(damping=0.6, tol=1e-7))),
    "EP power 0.7": (vj.EP(power=0.7), (vj.EP(power=0.7), vj.EP(power=0.9, tol=1e-7))),
    "LVB": (vj.LVB(), (vj.LVB(), vj.LVB(tol=1e-8))),
    "Laplace": (vj.Laplace(), (vj.Laplace(solver=GN()), vj.Laplace(solver=GN(tol=1e-9)))),
    "MAP": (vj.MAP(), (vj.MAP(solver=GN()), vj.MAP(solver=GN(tol=1e-9)))),
    "mean field": (vj.MeanField(), (vj.MeanField(solver=NG()), vj.MeanField(solver=NG(tol=1e-9)))),
    "AI-KL": (vj.AIKL(lattice_points=32), (vj.AIKL(lattice_points=32), vj.AIKL(lattice_points=32, tol_k=1e-2))),
}


def data(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, 3))
    y = (X @ np.array([1.0, -1.0, 0.5]) + rng.logistic(size=40) > 0).astype(float)
    return vj.glm.logistic_regression(X, y)


def built(fn):
    before, seconds = _BUILT[0], _BUILT[1]
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, _BUILT[0] - before, _BUILT[1] - seconds, time.perf_counter() - start


def fresh(name):
    """A cold fit of ``name`` in this (new) process: programs built and compile seconds, one line."""
    warnings.simplefilter("ignore")
    model = data(0)
    jax.block_until_ready(jax.numpy.asarray(1.0) + 1.0)
    _, cold, seconds, _ = built(lambda: vj.infer(model, METHODS[name][0]))
    print(f"{cold} {seconds}")


def main():
    import subprocess
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--fresh":
        return fresh(sys.argv[2])
    warnings.simplefilter("ignore")
    log = Tee()
    model, other = data(0), data(1)
    jax.block_until_ready(jax.numpy.asarray(1.0) + 1.0)  # the process's one-off programs for a Python float
    log("programs built (compile seconds), logistic regression N = 40, D = 3")
    log("fresh: a cold fit in a new process; in turn: the same in one process after the methods above it "
        "(a shared start is built once)")
    log(f"{'method':<16} {'fresh':>12} {'in turn':>12} {'new data':>9} {'warm':>5} {'settings':>9} {'from Laplace':>13}")
    for name, (method, (tuned, retuned)) in METHODS.items():
        out = subprocess.run([sys.executable, __file__, "--fresh", name], capture_output=True, text=True)
        first, first_s = out.stdout.split()[-2:]
        post, cold, cold_s, _ = built(lambda: vj.infer(model, method))
        _, new_data, _, _ = built(lambda: vj.infer(other, method))
        _, warm, _, _ = built(lambda: vj.infer(model, method, init=post))
        vj.infer(model, tuned)
        _, settings, _, _ = built(lambda: vj.infer(model, retuned))
        laplace = vj.infer(model, vj.Laplace())
        _, converted, conv_s, _ = built(lambda: vj.infer(model, method, init=laplace))
        log(f"{name:<16} {int(first):>3} ({float(first_s):5.1f} s) {cold:>3} ({cold_s:5.1f} s) {new_data:>9} {warm:>5} "
            f"{settings:>9} {converted:>5} ({conv_s:4.2f} s)")
    log.save("compile_counts")


if __name__ == "__main__":
    main()
