"""Gaussian processes: kernels, GP models for every method, prediction, ML-II and sparse bounds.

    k = vj.gp.kernels.SquaredExponential(lengthscale=jnp.ones(d), variance=1.0)
    model = vj.gp.model(k, X, likelihood=vj.potentials.StudentT(df=3.0, scale=0.1, loc=y))
    post = vj.infer(model, vj.EP())                    # any method
    f_mean, f_var = vj.gp.predict(post, X_test)        # latent predictive at test inputs (the model records k, X)

Multi-class classification: `vj.gp.multiclass` and `vj.gp.softmax`. Sparse GPs with inducing inputs:
`collapsed_elbo`, `optimal_inducing_posterior`, `svgp_elbo`, `svgp_natural_step`, `predict_sparse`.
"""

from . import kernels, multiclass, softmax
from .hyper import HyperparameterFit, fit_hyperparameters
from .models import GPModel, log_predictive, model, predict, predict_proba
from .sparse import collapsed_elbo, optimal_inducing_posterior, predict_sparse, svgp_elbo, svgp_natural_step

__all__ = ["kernels", "multiclass", "softmax", "model", "GPModel", "predict", "predict_proba", "log_predictive",
           "fit_hyperparameters", "HyperparameterFit", "collapsed_elbo", "optimal_inducing_posterior", "predict_sparse",
           "svgp_elbo", "svgp_natural_step"]
__dir__ = __all__.copy
