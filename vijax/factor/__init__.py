"""Latent Gaussian factor models of discrete and mixed data (Khan thesis), fitted by variational EM.

    z_n ~ N(μ, Σ),   η_dn = W_d z_n + w_0d,   y_dn ~ p_d(y | η_dn)

>>> model = vj.factor.factor_analysis(vj.factor.Bernoulli(), latent_dim=3, key=key, num_columns=D)
>>> post = vj.infer(vj.factor.observe(model, Y, mask), vj.factor.EM())   # post.log_z: the final bound
>>> post.fitted                                    # the learned FactorModel (loadings, offsets, prior)
>>> post.diagnostics.objective_trace               # the bound per EM iteration, never falling
>>> log_p = vj.factor.log_predictive(post, Y_true, key=key)

`observe` pairs a model with its data (an `ObservedModel`); `EM` (variational EM) and `EStep` (the
per-row posteriors under a model held fixed: new rows under a fitted model) are methods of `vj.infer`
and return a `FactorPosterior`. Likelihoods (`likelihoods`): `GaussianColumn`, `Bernoulli` (piecewise /
Jaakkola / Böhning bounds), `PoissonColumn`, `Ordinal` (cumulative logit), `StickBreaking` and
`Multinomial` (Böhning / log / tilted) for categorical data; mixed data are blocks of columns with
different likelihoods. `graphical_model` builds the latent Gaussian graphical model (W = I), with an
ℓ1 penalty on Σ⁻¹ for the sparse variant. `e_step`, `m_step` and `initial_posteriors` are the pure
building blocks of the methods.
"""

from .em import (EM, EMState, EStep, FactorInfo, FactorPosterior, Posteriors, e_step, initial_posteriors, m_step,
                 penalty_term)
from .likelihoods import (AbstractLikelihood, Bernoulli, GaussianColumn, Multinomial, Ordinal, PoissonColumn,
                          StickBreaking)
from .model import Block, FactorModel, ObservedModel, elbo_point, factor_analysis, graphical_model, observe
from .predict import impute, log_predictive, probabilities

__all__ = ["FactorModel", "Block", "factor_analysis", "graphical_model", "observe", "ObservedModel", "EM", "EStep",
           "EMState", "FactorPosterior", "FactorInfo", "e_step", "m_step", "initial_posteriors", "Posteriors",
           "elbo_point", "penalty_term", "log_predictive", "probabilities", "impute", "AbstractLikelihood",
           "GaussianColumn", "Bernoulli", "PoissonColumn", "Ordinal", "StickBreaking", "Multinomial"]


def __dir__():
    return list(__all__)
