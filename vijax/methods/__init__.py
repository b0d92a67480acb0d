"""Inference methods: configuration objects with a ``fit(model, init)`` method."""

from . import gkl
from .gkl import GKL

__all__ = ["gkl", "GKL"]
