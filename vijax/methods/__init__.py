"""Inference methods: configuration objects, subclasses of `AbstractMethod`, each with a State,
``start(model) -> State`` and ``fit(model, state) -> Posterior`` (see `vijax.methods._base`)."""

from . import aikl, ep, ep_hyper, gkl, laplace, lvb
from ._base import AbstractMethod
from .aikl import AIKL
from .ep import EP
from .ep_hyper import HierarchicalEP
from .gkl import GKL
from .laplace import Laplace
from .lvb import LVB
from .map import MAP
from .meanfield import MeanField

__all__ = ["AbstractMethod", "aikl", "AIKL", "ep", "EP", "ep_hyper", "HierarchicalEP", "gkl", "laplace", "lvb", "GKL", "Laplace", "LVB", "MAP", "MeanField"]
__dir__ = __all__.copy
