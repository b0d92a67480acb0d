"""Sparse linear models (`sparse_linear_model`, with filters B from `filters`), design criteria from q(w) = N(m, S),
and the `sequential` fit → design → measure → refit loop (`vj.design`)."""

from . import filters
from .criteria import (covariance_product, entropy, free_design, greedy_rows, information_gain, lanczos,
                       lanczos_variances, leading_eigenvectors, row_gains)
from .model import ep_sites, measurement_sites, smoothed_laplace, sparse_linear_model
from .sequential import FIT_TOL, SequentialResult, design_method, random_rows, sequential

__all__ = ["sparse_linear_model", "measurement_sites", "ep_sites", "smoothed_laplace", "filters", "covariance_product",
           "information_gain", "row_gains", "greedy_rows", "lanczos", "leading_eigenvectors", "lanczos_variances",
           "free_design", "entropy", "sequential", "SequentialResult", "random_rows", "design_method", "FIT_TOL"]
__dir__ = __all__.copy
