"""Tests run in float64; float32 behaviour is checked explicitly where it matters."""

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Drop each module's compiled executables when it ends: keeps the suite's memory flat."""
    yield
    jax.clear_caches()
