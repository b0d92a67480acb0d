"""The robustness suite: every method, with its defaults, on real-data-shaped problems whose exact
posterior is known from a grid (see `robustness_cases.py`; `python benchmarks/robustness.py` prints
the whole table)."""

import pytest

import robustness_cases as cases

# LVB's EM under a flat prior on separable data: the Jaakkola bound keeps rising as q spreads along
# the separating direction (still 0.3 nats a 10⁴ steps after 10⁵ steps), so no finite ξ is its
# optimum. The fit says so (`converged` False and a vj.ConvergenceWarning).
KNOWN = {("logistic, separable, v = 1e6", "LVB"): "not converged"}

PAIRS = [pytest.param(p, m, id=f"{p.name} | {m}") for p in cases.PROBLEMS for m in cases.METHODS
         if cases.applies(p, m)]


@pytest.mark.parametrize("problem, method", PAIRS)
def test_default_fit_is_right_or_says_why(problem, method):
    outcome = cases.run(problem, method)
    assert outcome.status == KNOWN.get((problem.name, method), "ok"), outcome.detail
