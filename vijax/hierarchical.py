"""Latent linear models whose Gaussian sites have uncertain log variances (hierarchical priors).

$$
p(w, φ) \\propto \\prod_g \\prod_n \\mathcal N\\big(h_{gn}^\\top w + b_{gn} \\mid y_{gn},\\ e^{φ_{l_{gn}}}\\big)
\\prod_{l=1}^L \\mathcal N(φ_l \\mid μ_{0,l}, σ^2_{0,l})
$$

A site group may instead be Student-t, St(y_{gn} | h_{gn}ᵀw + b_{gn}, ν, e^{φ_l}). E.g. a sparse linear model
with an uncertain noise variance and ARD prior sites N(w_j | 0, e^{φ_{l_j}}) (`vj.glm.hierarchical_linear`).
``vj.infer(model, vj.HierarchicalEP())`` fits it; ``vj.infer(model.model, vj.EP())`` is EP at φ = μ_0.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, potentials
from .model import LatentLinearModel, Sites

__all__ = ["HierarchicalModel"]
__dir__ = __all__.copy

# Location–scale sites whose scale² is e^φ (`vj.methods.ep_hyper.scale_tilted_moments`).
_SCALE_SITES = (potentials.Gaussian, potentials.StudentT)


class HierarchicalModel(eqx.Module):
    """Gaussian sites with uncertain log variances φ and a Gaussian hyperprior on φ.

    ``model`` is the plug-in `LatentLinearModel`, every scale e^{μ_0/2}.

    **Arguments:**

    - `sites`: a `Sites` group or a tuple of them with `vj.potentials.Gaussian` or `StudentT` potentials
      (``loc`` the y_gn; ``scale`` ignored).
    - `hyper_index`: per group, an int array of shape ``(N_g,)`` (or a scalar) of indices in 0..L−1.
    - `hyper_mean`, `hyper_var`: the hyperprior N(φ_l | μ_{0,l}, σ²_{0,l}), shapes ``(L,)``.
    - `names`: optional names of the L hyperparameters (for summaries).
    """

    model: LatentLinearModel
    hyper_index: tuple
    hyper_mean: jax.Array
    hyper_var: jax.Array
    names: tuple = eqx.field(static=True, default=())

    def __init__(self, sites, hyper_index, hyper_mean, hyper_var, names=()):
        owner = "HierarchicalModel"
        if isinstance(sites, Sites):
            sites = (sites,)
        if isinstance(hyper_index, (int, np.integer)) or (hasattr(hyper_index, "ndim") and len(sites) == 1
                                                            and not isinstance(hyper_index, tuple)):
            hyper_index = (hyper_index,)
        hyper_index = tuple(hyper_index)
        if len(hyper_index) != len(sites):
            raise ValueError(f"{owner}: {len(sites)} site groups but {len(hyper_index)} entries in `hyper_index`; "
                             "give one index array per group.")
        dtype = _checks.data_dtype([group.projection for group in sites])
        dtype = _checks.float_dtype(hyper_mean, hyper_var) if dtype is None else dtype
        hyper_mean = _checks.as_param("hyper_mean", hyper_mean, owner, dtype, ndim=1)
        hyper_var = _checks.as_param("hyper_var", hyper_var, owner, dtype, ndim=1)
        _checks.check_finite("hyper_mean", hyper_mean, owner)
        _checks.check_positive("hyper_var", hyper_var, owner)
        if hyper_mean.shape != hyper_var.shape:
            raise ValueError(f"{owner}: `hyper_mean` has shape {hyper_mean.shape} but `hyper_var` {hyper_var.shape}.")
        num_hyper = hyper_mean.shape[0]
        groups, indices = [], []
        for g, (group, index) in enumerate(zip(sites, hyper_index)):
            if not isinstance(group.potential, _SCALE_SITES):
                raise ValueError(f"{owner}: site group {g} has a {type(group.potential).__name__} potential; "
                                 "hierarchical sites must be vj.potentials.Gaussian or StudentT (their scale² is e^φ).")
            index = jnp.broadcast_to(jnp.asarray(index), (group.num_sites,))
            if not jnp.issubdtype(index.dtype, jnp.integer):
                raise ValueError(f"{owner}: `hyper_index[{g}]` must hold integers, got dtype {index.dtype}.")
            if _checks.is_concrete(index) and (np.any(np.asarray(index) < 0) or np.any(np.asarray(index) >= num_hyper)):
                raise ValueError(f"{owner}: `hyper_index[{g}]` must lie in 0..{num_hyper - 1} (one per hyperparameter).")
            scale = jnp.exp(0.5 * hyper_mean[index])
            groups.append(Sites(group.projection, eqx.tree_at(lambda t: t.scale, group.potential, scale), group.offset))
            indices.append(index)
        if names and len(names) != num_hyper:
            raise ValueError(f"{owner}: {len(names)} `names` for {num_hyper} hyperparameters.")
        self.model = LatentLinearModel(None, tuple(groups))
        self.hyper_index = tuple(indices)
        self.hyper_mean = hyper_mean
        self.hyper_var = hyper_var
        self.names = tuple(names)

    @property
    def num_hyper(self) -> int:
        return self.hyper_mean.shape[0]

    @property
    def dim(self) -> int:
        return self.model.dim

    @property
    def dtype(self):
        return self.model.dtype
