"""Multi-class GP classification: C classes over N inputs, integer labels 0 … C − 1.

`model(kernel, X, labels, num_classes)` is fitted by `NestedEP()` (multinomial probit) or
`vj.gp.softmax.SoftmaxBound(bound)` (softmax); `stick_breaking_model(...)` is a `vj.LatentLinearModel`.

    post = vj.infer(vj.gp.multiclass.model(kernel, X, labels, num_classes), vj.gp.multiclass.NestedEP())
    p = vj.gp.multiclass.predict_proba(post, X_test)                  # (T, C)
"""

from . import probit, stick_breaking
from .._layout import MulticlassModel, model
from .probit import *  # noqa: F403 (the public names of each model, listed in its __all__)
from .stick_breaking import *  # noqa: F403

__all__ = ["model", "MulticlassModel", "probit", "stick_breaking", *probit.__all__, *stick_breaking.__all__]
__dir__ = __all__.copy
