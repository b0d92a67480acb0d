"""Tests run in float64; float32 behaviour is checked explicitly where it matters."""

import json
import os
import shutil
import tempfile
import time

# XLA's CPU code generation for the test session (the tests only; vijax leaves it alone): LLVM at
# optimisation level 0 and XLA's loop emitters compile in about a quarter of the time and run slower;
# the programs (HLO) are the same, the machine code rounds differently (tests/README.md, "Compiler
# settings"). VIJAX_TEST_XLA_FLAGS replaces these flags ("default": XLA's own settings, what users
# get); flags already in XLA_FLAGS are kept. Set before JAX starts its backend.
_TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
_flags = os.environ.get("VIJAX_TEST_XLA_FLAGS", _TEST_XLA_FLAGS)
if _flags != "default":
    _given = os.environ.get("XLA_FLAGS", "")
    _added = [f for f in _flags.split() if f.split("=")[0] not in _given]
    os.environ["XLA_FLAGS"] = " ".join([_given, *_added]).strip()

import jax  # noqa: E402
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

# A persistent compilation cache for the test session (the tests only; vijax itself leaves JAX's
# configuration alone). Most of the suite's time is XLA compilation, and many programs recur: in
# later modules (after `jax.clear_caches()` below) and, under pytest-xdist, on the other worker.
# The directory is made once per session, by the first pytest process (xdist's workers inherit it
# through the environment), and removed when that process ends. Set VIJAX_TEST_COMPILATION_CACHE
# to a directory to keep the cache across runs, or to "off" to compile everything afresh.
_CACHE_VARIABLE = "VIJAX_TEST_COMPILATION_CACHE"
_owned_cache_dir = None
if os.environ.get(_CACHE_VARIABLE) is None:
    _owned_cache_dir = os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="vijax-test-jax-cache-")
if os.environ[_CACHE_VARIABLE] != "off":
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_VARIABLE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config):
    if _owned_cache_dir is not None:
        shutil.rmtree(_owned_cache_dir, ignore_errors=True)


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Drop each module's compiled executables when it ends: keeps the suite's memory flat."""
    yield
    jax.clear_caches()


# VIJAX_TEST_PROGRAMS=<prefix>: write, per pytest process, ``<prefix>.<worker>.json`` with every test's
# wall time, the programs XLA built during it (compiled or loaded from the cache) and their compile
# seconds; `python tests/programs.py <prefix>` sums them by file (see tests/README.md).
_PROGRAMS = os.environ.get("VIJAX_TEST_PROGRAMS")
_rows = []

if _PROGRAMS:
    from helpers import built  # the tests' one compile listener

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        (programs, seconds), start = built(), time.perf_counter()
        yield
        after = built()
        _rows.append({"test": item.nodeid, "wall": time.perf_counter() - start,
                      "programs": after[0] - programs, "compile": after[1] - seconds})

    def pytest_sessionfinish(session):
        if _rows:
            with open(f"{_PROGRAMS}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json", "w") as f:
                json.dump(_rows, f)
