"""Research baselines that the benchmarks compare vijax with; not part of the library.

- `fast_gkl`: Khan's concave coordinate ascent (thesis Alg. 3) and the Opper–Archambeau L-BFGS
  baseline for the G-KL bound of GP-type models, built on the library's site-form pieces
  (`vijax.methods._gkl_natural`'s primal factorisation and site bound, `vijax.methods._gaussian`).

Import as ``benchmarks.baselines.fast_gkl`` from the repository root (``python -m pytest`` and
``python -m benchmarks.<script>`` put it on ``sys.path``); the scripts in ``benchmarks/`` add the root
themselves.
"""
