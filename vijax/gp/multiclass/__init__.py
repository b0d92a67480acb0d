"""Multi-class GP classification: two models, C classes over N inputs, integer labels 0 … C − 1.

- `probit`: the multinomial-probit likelihood by nested EP (Riihimäki, Jylänki & Vehtari 2013):
  `nested_ep` → `NestedEPResult`, `predict`, `predict_proba` (``rule="ep"`` or ``"quadrature"``),
  `tilted_moments`, `nested_ep_log_z`, `posterior_covariance`, `multinomial_probit_log_likelihood`.
- `stick_breaking`: Khan's stick-breaking logistic likelihood as a `vj.LatentLinearModel` for every
  method of `vj.infer`: `stick_breaking_model` → `StickBreakingModel`, `stick_breaking_predict`,
  `stick_breaking_proba`, `stick_breaking_probabilities`.

Both record their layout (kernels, X, labels, C, the stick ordering), so predictions take
``(fit, X_test)``:

    result = vj.gp.multiclass.nested_ep(kernel, X, labels, num_classes)
    p = vj.gp.multiclass.predict_proba(result, X_test)                # (T, C)

    post = vj.infer(vj.gp.multiclass.stick_breaking_model(kernel, X, labels, num_classes), vj.GKL())
    p = vj.gp.multiclass.stick_breaking_proba(post, X_test)           # (T, C)

The softmax likelihood is `vj.gp.softmax`.
"""

from . import probit, stick_breaking
from .probit import *  # noqa: F403 (the public names of each model, listed in its __all__)
from .stick_breaking import *  # noqa: F403

__all__ = ["probit", "stick_breaking", *probit.__all__, *stick_breaking.__all__]


def __dir__():
    return list(__all__)
