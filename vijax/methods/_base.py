"""The base class of every inference method (`vj.GKL`, `vj.EP`, `vj.Laplace`, `vj.MAP`, `vj.LVB`, `vj.MeanField`,
`vj.AIKL`)."""

from __future__ import annotations

import abc

import equinox as eqx

from ..model import LatentLinearModel
from ..posterior import Posterior

__all__ = ["AbstractMethod"]


class AbstractMethod(eqx.Module):
    """An inference method: frozen configuration with one operation, ``fit(model, init)``.

    ``vj.infer(model, method, init)`` checks its arguments, compiles ``method.fit`` and warns when the
    fit did not converge; subclass this (and implement `fit`) to make a method `vj.infer` accepts.

    **Warm starts (``init``), the same rule for every method.** ``init`` is one of

    - ``None``: the method's own starting point, computed from the data (for every built-in method
      the mode of the log joint, or its second-order expansion there; never the prior alone);
    - a `Posterior` returned by an earlier fit: the method starts from it (its mean, and its
      covariance or method state where the method uses them). A `Posterior` from the *same* method
      restarts exactly where that fit ended (`vj.EP` needs this one: it restarts from
      ``post.state``, its sites, and refuses a `Posterior` of another method with a `ValueError`);
    - the method's own parameters: `vj.gkl.GaussianParams` (`GKL`, and `MeanField` with Gaussian
      factors), `vj.ep.SiteParams` (`EP`), a `vj.lvb.LVBState` or a tuple of ξ arrays, one per site
      group (`LVB`), a ``(D,)`` array, the starting point of the mode search (`Laplace`, `MAP`), or
      `vj.aikl.AIKLParams` (`AIKL`).

    Anything else is refused with a `ValueError` that says what the method accepts. A warm start
    changes where the iterations begin, not the optimum they converge to.
    """

    @abc.abstractmethod
    def fit(self, model: LatentLinearModel, init=None) -> Posterior:
        """Fit q to ``model`` from ``init`` (see the class docstring); returns a `Posterior`.

        Pure and traceable: it runs under `jax.jit`, `jax.vmap` and `jax.grad`."""
