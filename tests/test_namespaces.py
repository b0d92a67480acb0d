"""Public namespaces list what they export (`__all__`) and show nothing else on tab completion."""

import importlib
import pathlib
import types

import pytest

import vijax as vj

LEAKS = {"np", "jnp", "jax", "eqx", "optax", "numpy", "equinox", "warnings", "functools", "math", "abc"}


def _public_modules():
    """vijax and every module reachable from it through `__all__`, plus the optional ones."""
    seen, todo = {}, [vj]
    while todo:
        mod = todo.pop()
        if mod.__name__ in seen:
            continue
        seen[mod.__name__] = mod
        for name in getattr(mod, "__all__", ()):
            value = getattr(mod, name)
            if isinstance(value, types.ModuleType) and value.__name__.startswith("vijax."):
                todo.append(value)
    return seen


PUBLIC = sorted(_public_modules())


def test_the_walk_finds_the_namespaces():
    for name in ["vijax.glm", "vijax.gp", "vijax.gp.kernels", "vijax.gp.multiclass", "vijax.factor",
                 "vijax.potentials", "vijax.covariance", "vijax.solvers", "vijax.design.filters", "vijax.methods.ep"]:
        assert name in PUBLIC


@pytest.mark.parametrize("name", PUBLIC + ["vijax.plot", "vijax.sklearn"])
def test_namespace_exports_only_its_own_names(name):
    if name == "vijax.sklearn":
        pytest.importorskip("sklearn")
    mod = importlib.import_module(name)
    assert isinstance(mod.__all__, list) and mod.__all__, f"{name} has no __all__"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    listed = set(dir(mod))
    leaked = sorted(n for n in listed if n in LEAKS or (
        isinstance(getattr(mod, n, None), types.ModuleType) and not getattr(mod, n).__name__.startswith("vijax")))
    assert not leaked, f"dir({name}) shows foreign modules: {leaked}"
    assert not LEAKS & set(mod.__all__)


def test_optional_modules_are_not_imported_by_vijax():
    # `vj.sklearn` and `vj.plot` load on first access, so `import vijax` needs neither dependency.
    import subprocess
    import sys

    code = "import sys, vijax; print('sklearn' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_package_is_typed():
    assert (pathlib.Path(vj.__file__).parent / "py.typed").is_file()
