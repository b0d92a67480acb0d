"""Bayesian two-layer neural networks with hierarchical (ARD / common-scale) priors, fitted by EP.

``post = vj.infer(vj.nn.TwoLayerNetwork(X, y, num_hidden=8), vj.nn.NetworkEP())``; then
``post.predict(X_test)``, ``post.log_predictive(X_test, y_test)``, ``post.relevances()`` (`vijax.nn.network`).
"""

from .network import (NetworkEP, NetworkInfo, NetworkPosterior, NetworkSites, NetworkState, TwoLayerNetwork, activation,
                      expected_activation, map_estimate)

__all__ = ["TwoLayerNetwork", "NetworkEP", "NetworkPosterior", "NetworkState", "NetworkSites", "NetworkInfo",
           "activation", "expected_activation", "map_estimate"]
__dir__ = __all__.copy
