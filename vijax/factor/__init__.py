"""Latent Gaussian factor models of discrete and mixed data (Khan thesis), fitted by variational EM.

    z_n ~ N(μ, Σ),   η_dn = W_d z_n + w_0d,   y_dn ~ p_d(y | η_dn)

>>> model = vj.factor.factor_analysis(vj.factor.Bernoulli(), latent_dim=3, key=key, num_columns=D)
>>> result = vj.factor.fit(model, Y, mask, progress=True)     # result.log_z: the final bound
>>> result.diagnostics.objective_trace                        # the bound per EM iteration, never falling
>>> log_p = vj.factor.log_predictive(result, Y_true, key=key)

Likelihoods (`likelihoods`): `GaussianColumn`, `Bernoulli` (piecewise / Jaakkola / Böhning bounds),
`PoissonColumn`, `Ordinal` (cumulative logit), `StickBreaking` and `Multinomial` (Böhning / log / tilted)
for categorical data; mixed data are blocks of columns with different likelihoods. `graphical_model`
builds the latent Gaussian graphical model (W = I), with an ℓ1 penalty on Σ⁻¹ for the sparse variant.
"""

from .em import FactorFit, Posteriors, e_step, fit, initial_posteriors, m_step, penalty_term
from .likelihoods import (AbstractLikelihood, Bernoulli, GaussianColumn, Multinomial, Ordinal, PoissonColumn,
                          StickBreaking)
from .model import Block, FactorModel, elbo_point, factor_analysis, graphical_model
from .predict import impute, log_predictive, probabilities

__all__ = ["FactorModel", "Block", "factor_analysis", "graphical_model", "fit", "e_step", "m_step",
           "initial_posteriors", "Posteriors", "FactorFit", "elbo_point", "penalty_term", "log_predictive",
           "probabilities", "impute", "AbstractLikelihood", "GaussianColumn", "Bernoulli", "PoissonColumn", "Ordinal",
           "StickBreaking", "Multinomial"]

_RENAMED = {"Gaussian": "GaussianColumn", "Poisson": "PoissonColumn"}


def __getattr__(name):
    # The old names clashed with vj.potentials.Gaussian / Poisson; they still work, with a warning.
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(f"vj.factor.{name} is deprecated: use vj.factor.{new} (the same class; vj.potentials.{name} "
                      "is the site potential).", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

def __dir__():
    return list(__all__)
