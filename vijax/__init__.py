"""vijax: deterministic approximate inference for latent linear models in JAX."""

from . import (covariance, design, factor, gaussian, glm, gp, hierarchical, methods, nn, piecewise, potentials,
               projections, quadrature, solvers)
from .inference import ConvergenceWarning, infer
from .methods import (AIKL, EP, GKL, LVB, MAP, AbstractMethod, HierarchicalEP, Laplace, MeanField, aikl, ep, ep_hyper,
                      gkl, laplace, lvb)
from .hierarchical import HierarchicalModel
from .model import GaussianFactor, Identity, LatentLinearModel, Sites
from .padding import pad_sites
from .posterior import Diagnostics, EPInfo, LaplaceInfo, Posterior
from .sharding import shard_sites

__version__ = "0.1.0"

__all__ = [
    "infer",
    "ConvergenceWarning",
    "Posterior",
    "Diagnostics",
    "EPInfo",
    "LaplaceInfo",
    "AbstractMethod",
    "methods",
    "LatentLinearModel",
    "GaussianFactor",
    "Sites",
    "Identity",
    "GKL",
    "EP",
    "ep",
    "HierarchicalEP",
    "ep_hyper",
    "HierarchicalModel",
    "hierarchical",
    "nn",
    "gkl",
    "Laplace",
    "laplace",
    "MAP",
    "LVB",
    "lvb",
    "MeanField",
    "AIKL",
    "aikl",
    "covariance",
    "potentials",
    "piecewise",
    "quadrature",
    "solvers",
    "glm",
    "factor",
    "design",
    "gp",
    "shard_sites",
    "pad_sites",
]
