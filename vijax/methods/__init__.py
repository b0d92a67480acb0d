"""Inference methods: configuration objects with a ``fit(model, init)`` method."""

from . import gkl, laplace
from .gkl import GKL
from .laplace import Laplace
from .map import MAP

__all__ = ["gkl", "laplace", "GKL", "Laplace", "MAP"]
