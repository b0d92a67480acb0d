"""vijax: deterministic approximate inference for latent linear models in JAX."""

from . import (covariance, design, factor, gaussian, glm, gp, hierarchical, hyper, methods, nn, piecewise, potentials,
               projections, quadrature, solvers, start)
from .inference import ConvergenceWarning, infer
from .methods import (AIKL, EP, GKL, LVB, MAP, AbstractMethod, HierarchicalEP, Laplace, MeanField, aikl, ep, ep_hyper,
                      gkl, laplace, lvb)
from .hierarchical import HierarchicalModel
from .model import GaussianFactor, Identity, LatentLinearModel, Sites
from .padding import pad_sites
from .posterior import Diagnostics, EPInfo, LaplaceInfo, Posterior
from .solvers import Status
from .sharding import shard_sites

__version__ = "0.1.0"

# Modules with optional dependencies, imported on first access: `vj.sklearn` (scikit-learn) and
# `vj.plot` (matplotlib), so that `import vijax` needs neither.
_LAZY = ("sklearn", "plot")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(__all__) | set(_LAZY))

__all__ = ["infer", "ConvergenceWarning", "Posterior", "Diagnostics", "Status", "EPInfo", "LaplaceInfo",
           "AbstractMethod", "methods", "LatentLinearModel", "GaussianFactor", "Sites", "Identity", "GKL", "EP", "ep",
           "HierarchicalEP", "ep_hyper", "HierarchicalModel", "hierarchical", "nn", "gkl", "Laplace", "laplace", "MAP",
           "LVB", "lvb", "MeanField", "AIKL", "aikl", "covariance", "potentials", "piecewise", "quadrature", "solvers",
           "start", "glm", "factor", "design", "gp", "hyper", "shard_sites", "pad_sites"]
