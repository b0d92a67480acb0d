"""Latent Gaussian factor models of discrete and mixed data (Khan thesis), fitted by variational EM.

    z_n ~ N(μ, Σ),   η_dn = W_d z_n + w_0d,   y_dn ~ p_d(y | η_dn)

>>> model = vj.factor.factor_analysis(vj.factor.Bernoulli(), latent_dim=3, key=key, num_columns=D)
>>> post = vj.infer(vj.factor.observe(model, Y, mask), vj.factor.EM())   # post.log_z: the final bound
>>> log_p = vj.factor.log_predictive(post, Y_true, key=key)

Mixed data are blocks of columns with different likelihoods; `graphical_model` builds the latent Gaussian
graphical model (W = I), with an ℓ1 penalty on Σ⁻¹ for the sparse variant.
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
__dir__ = __all__.copy
