"""Multi-class GP classification: C classes over N inputs, integer labels 0 … C − 1.

One model, several likelihoods and methods, all through `vj.infer`:

- `model(kernel, X, labels, num_classes)` → `MulticlassModel`: C latent functions f_c ~ GP(0, K_c),
  the kernels, inputs and labels recorded. Fit it with `NestedEP()` (the multinomial probit by
  nested EP, Riihimäki, Jylänki & Vehtari 2013: a `NestedEPPosterior`, `predict`, `predict_proba`
  with ``rule="ep"`` or ``"quadrature"``) or with `vj.gp.softmax.SoftmaxBound(bound)` (the softmax
  likelihood by local bounds; `vj.gp.softmax.predict_proba`).
- `stick_breaking_model(kernel, X, labels, num_classes)` → `StickBreakingModel`: Khan's stick-breaking
  logistic likelihood as a `vj.LatentLinearModel`, for every method of `vj.infer`;
  `stick_breaking_predict`, `stick_breaking_proba`, `stick_breaking_probabilities`.

Every posterior records its model, so predictions take ``(post, X_test)``:

    model = vj.gp.multiclass.model(kernel, X, labels, num_classes)
    post = vj.infer(model, vj.gp.multiclass.NestedEP())
    p = vj.gp.multiclass.predict_proba(post, X_test)                  # (T, C)

    post = vj.infer(vj.gp.multiclass.stick_breaking_model(kernel, X, labels, num_classes), vj.GKL())
    p = vj.gp.multiclass.stick_breaking_proba(post, X_test)           # (T, C)

Also: `tilted_moments` (the inner EP for one cavity), `energy` (nested EP's log Z at given sites, a
pure function of the model), `multinomial_probit_log_likelihood`.
"""

from . import probit, stick_breaking
from .._layout import MulticlassModel, model
from .probit import *  # noqa: F403 (the public names of each model, listed in its __all__)
from .stick_breaking import *  # noqa: F403

__all__ = ["model", "MulticlassModel", "probit", "stick_breaking", *probit.__all__, *stick_breaking.__all__]


def __dir__():
    return list(__all__)
