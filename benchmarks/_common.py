"""What the benchmark scripts share: where results go, one timer, one tee logger, mean ± s.e.

Each script in ``benchmarks/`` holds only its experiment; it imports these (``from _common import
...``: scripts run as ``python benchmarks/<name>.py``, which puts this folder on ``sys.path``).
"""

from __future__ import annotations

import math
import pathlib
import time

import numpy as np

__all__ = ["RESULTS", "Tee", "mean_se", "timed", "plot_error_curves"]

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def timed(fn, *args, repeats=1, warmup=0):
    """Call ``fn(*args)`` ``warmup`` times untimed, then ``repeats`` times timed.

    Each call is timed from its start until its JAX results are ready (`jax.block_until_ready`,
    which passes anything that is not a JAX array through), so asynchronous dispatch does not
    hide the work. Returns ``(result of the last call, [seconds of each timed call])``.
    """
    import jax  # here, so that scripts whose parent process never runs JAX do not import it

    result = None
    for _ in range(warmup):
        result = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return result, times


class Tee:
    """``print`` that also keeps each line, to save as ``benchmarks/results/<name>.txt``.

    ``log = Tee(); log("a line"); log.save("name")`` prints ``a line`` (flushed) and writes the
    lines, one per line, to ``RESULTS / "name.txt"`` (or to ``out / "name.txt"``).
    """

    def __init__(self):
        self.lines = []

    def __call__(self, *lines):
        for line in lines or ("",):
            print(line, flush=True)
            self.lines.append(str(line))

    @property
    def text(self) -> str:
        """The lines logged so far, each ended by a newline."""
        return "".join(line + "\n" for line in self.lines)

    def save(self, name: str, out=None, header: str | None = None) -> pathlib.Path:
        """Write ``header`` (if any, on its own line) and the lines to ``<out or RESULTS>/<name>.txt``."""
        out = pathlib.Path(out) if out is not None else RESULTS
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name}.txt"
        path.write_text(("" if header is None else header + "\n") + self.text)
        return path


def mean_se(values, finite_only=True, count=False):
    """(mean, standard error of the mean) of ``values``; with ``count``, (mean, s.e., n) for the n values used.

    The standard error is s/√n with s the sample standard deviation (``ddof=1``); it is NaN for a
    single value, and both are NaN for none. With ``finite_only`` (the default), ``None`` and
    non-finite values are left out first (failed or diverged runs); otherwise they propagate.
    """
    if finite_only:
        values = [v for v in values if v is not None and math.isfinite(v)]
    a = np.asarray(values, float)
    if len(a) == 0:
        mean = se = float("nan")
    else:
        mean = float(a.mean())
        se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else float("nan")
    return (mean, se, len(a)) if count else (mean, se)


def plot_error_curves(ax, curves, title):
    """One line per method with a ± s.e. band: ``curves[label]`` holds ``N``, ``mean`` and ``se`` lists
    (the reconstruction-error figures of the design benchmarks)."""
    for label, c in curves.items():
        N, m, s = np.array(c["N"]), np.array(c["mean"]), np.nan_to_num(np.array(c["se"]))
        ax.plot(N, m, label=label)
        ax.fill_between(N, m - s, m + s, alpha=0.25)
    ax.set_xlabel("number of measurements N")
    ax.set_ylabel("ℓ2 reconstruction error")
    ax.set_title(title)
    ax.legend()
