"""Inference methods: configuration objects, subclasses of `AbstractMethod`, with a ``fit(model, init)`` method."""

from . import aikl, ep, gkl, laplace, lvb
from ._base import AbstractMethod
from .aikl import AIKL
from .ep import EP
from .gkl import GKL
from .laplace import Laplace
from .lvb import LVB
from .map import MAP
from .meanfield import MeanField

__all__ = ["AbstractMethod", "aikl", "AIKL", "ep", "EP", "gkl", "laplace", "lvb", "GKL", "Laplace", "LVB", "MAP", "MeanField"]


def __dir__():
    return list(__all__)
