"""vijax's modules form layers; a module imports only from its own layer or the layers below it.

Every module of ``vijax/`` is parsed with `ast` (no import is executed), and every ``import`` in it is
collected, the ones inside functions included. The layers, bottom to top (`LAYERS`):

 0. **foundation** — ``_checks``, ``_linalg``, ``_ellpack``, ``_piecewise_tables``, ``_piecewise``,
    ``quadrature``, ``solvers``: numerics that know nothing of models. The solvers sit here rather
    than above the objectives (where issue 23 listed them) because that is what they are: a solver
    maximises ``fn(x)`` of a flat vector and returns a `Solution`; it imports nothing from vijax but
    ``_linalg``, and keeping it at the bottom keeps it that way.
 1. **potentials** — ``potentials`` (site potentials φ; they use the quadrature rules).
 2. **model** — ``projections``, ``gaussian``, ``model``: projections H, Gaussian factors, `Sites` and
    `LatentLinearModel`.
 3. **model tools** — ``padding``, ``sharding``, ``piecewise``: functions from a model to a model
    (padded sites, sharded sites, logistic sites replaced by piecewise bounds).
 4. **covariance** — the covariance families and their factors (``vijax.covariance``). A family is
    handed what it needs by the method that uses it (a curvature, the method's objective), never
    imports it.
 5. **objectives** — ``_curvature`` (the site curvature P shared by every method) and ``posterior``.
 6. **methods** — ``vijax.methods`` (G-KL, LVB, EP, Laplace, MAP, mean field and their helpers).
 7. **inference** — ``inference`` (``vj.infer``) and ``hyper`` (hyperparameters integrated by
    ``infer`` over a user's ``build(theta)``). It sits below the model builders, not above them as
    issue 23 listed it, because builders run inference (``gp.hyper`` fits hyperparameters by
    ``infer``), while ``infer`` itself needs only a model, a posterior and a method's ``fit``.
    ``hyper`` needs no builder either; the builders' predictive functions mix over its results
    through `vijax.posterior.Mixture`, so nothing imports ``hyper`` but the package.
 8. **models** — ``glm``, ``vijax.gp``, ``vijax.factor``, ``vijax.design``: builders, predictions and model-specific
    algorithms.
 9. **applications** — the package ``vijax`` itself (its ``__init__``), ``demo`` and ``data`` (the
    synthetic generators may use any builder), and the optional ``sklearn`` estimators and ``plot``
    helpers.

A subpackage's ``__init__`` belongs to the subpackage's layer. Imports within one layer are allowed,
but the whole import graph, function-local imports included, must have no cycle.

**Private names.** A module whose name begins with ``_`` is private to its package (the package and
its subpackages); a name beginning with ``_`` may be imported only from such a private module. So
``vijax.methods.gkl`` may import anything from ``vijax.methods._gaussian``, and every module may
import ``vijax._linalg`` or ``vijax._checks``; but ``vijax.methods`` may not import
``vijax.covariance._dense`` (it imports ``vijax.covariance``), and no module imports an underscore
name of a public module (``from .kernels import _inputs``). Shared helpers belong in a private
module of the package that shares them.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "vijax"

LAYERS = (
    ("foundation", ("_checks", "_linalg", "_factorisation", "_ellpack", "_piecewise_tables", "_piecewise", "quadrature", "solvers")),
    ("potentials", ("potentials",)),
    ("model", ("projections", "gaussian", "model", "hierarchical")),
    ("model tools", ("padding", "sharding", "piecewise")),
    ("covariance", ("covariance",)),
    ("objectives", ("_curvature", "posterior", "start")),
    ("methods", ("methods",)),
    ("inference", ("inference", "hyper")),
    ("models", ("glm", "gp", "factor", "design", "nn")),
    ("applications", ("", "demo", "data", "sklearn", "plot")),
)

# Known violations owned by other work, each with the fix it needs. Remove an entry once it is fixed;
# a new violation fails the test.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()  # (importer, module, name) exceptions: none


def _module_name(path: pathlib.Path) -> str:
    parts = ("vijax",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(module: str) -> int:
    """The index in `LAYERS` of ``module`` (a dotted name under vijax), matched by its first component."""
    head = module.split(".")[1] if "." in module else ""
    for index, (_, members) in enumerate(LAYERS):
        if head in members:
            return index
    raise KeyError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py (and docs/architecture.md).")


class Import:
    def __init__(self, importer, target, name, line, local):
        self.importer, self.target, self.name, self.line, self.local = importer, target, name, line, local

    def __repr__(self):
        what = f"from {self.target} import {self.name}" if self.name else f"import {self.target}"
        where = "function-local " if self.local else ""
        return f"{self.importer}:{self.line}: {where}{what}"


def _imports(module: str, path: pathlib.Path) -> list[Import]:
    """Every import of a vijax module in ``module``; ``from P import x`` where P.x is a module counts as P.x."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    local_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local_nodes.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        local = id(node) in local_nodes
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, None, node.lineno, local) for a in node.names if a.name.split(".")[0] == "vijax"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "vijax":
                target = node.module
            else:
                continue
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:  # `from . import x` imports the module x
                    found.append(Import(module, f"{target}.{alias.name}", None, node.lineno, local))
                else:
                    found.append(Import(module, target, alias.name, node.lineno, local))
    return found


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _is_private_module(module: str) -> bool:
    return module.split(".")[-1].startswith("_")


def _visible_to(private_module: str, importer: str) -> bool:
    """A private module P._x is visible to every module inside package P."""
    package = private_module.rsplit(".", 1)[0]
    return importer == package or importer.startswith(package + ".")


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)
    for imp in IMPORTS:
        assert imp.target in MODULES, f"{imp}: no such module in vijax/"


def test_no_import_from_a_higher_layer():
    upward = [f"{imp} (layer {LAYERS[layer_of(imp.importer)][0]!r} imports {LAYERS[layer_of(imp.target)][0]!r})"
              for imp in IMPORTS if layer_of(imp.target) > layer_of(imp.importer)]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_import_graph_has_no_cycle():
    graph = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.target != imp.importer and not imp.importer.startswith(imp.target + "."):
            # (a package's modules importing their own package's __init__ would be a cycle too, but
            # a submodule is always imported through its package, so only edges elsewhere count)
            graph[imp.importer].add(imp.target)
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_function_local_vijax_imports():
    """Lazy imports are for optional third-party packages (SciPy, scikit-learn, matplotlib) only."""
    local = [repr(imp) for imp in IMPORTS if imp.local]
    assert not local, "function-local imports of vijax modules (hoist them, or pass what is needed in):\n" + "\n".join(local)


def test_private_names_stay_in_their_package():
    bad = []
    for imp in IMPORTS:
        if _is_private_module(imp.target) and not _visible_to(imp.target, imp.importer):
            bad.append(f"{imp}: {imp.target} is private to {imp.target.rsplit('.', 1)[0]}")
        elif imp.name and imp.name.startswith("_") and not _is_private_module(imp.target):
            if (imp.importer, imp.target, imp.name) not in KNOWN_PRIVATE_IMPORTS:
                bad.append(f"{imp}: a private name of a public module")
    assert not bad, "private imports across modules:\n" + "\n".join(bad)


def test_the_scan_sees_imports(tmp_path):
    """The scan itself: known edges are found, and a function-local import is seen and marked."""
    targets = {(imp.importer, imp.target) for imp in IMPORTS}
    assert ("vijax.methods.gkl", "vijax.solvers") in targets
    assert ("vijax.covariance.sparse", "vijax.projections") in targets
    assert ("vijax", "vijax.covariance") in targets
    assert layer_of("vijax.covariance.subspace") > layer_of("vijax.model") > layer_of("vijax.potentials")
    assert layer_of("vijax.methods.gkl") > layer_of("vijax.posterior") > layer_of("vijax.covariance")
    path = tmp_path / "subspace.py"
    path.write_text("import jax\n\ndef update():\n    from ..methods.gkl import bound\n    import scipy\n")
    (imp,) = _imports("vijax.covariance.subspace", path)
    assert (imp.target, imp.name, imp.local, imp.line) == ("vijax.methods.gkl", "bound", True, 4)
    assert layer_of(imp.target) > layer_of(imp.importer)


def test_log_2pi_is_defined_once():
    """log 2π lives in `vijax._linalg.LOG_2PI`; no other module defines its own."""
    own = []
    for module, path in MODULES.items():
        if module == "vijax._linalg":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.lstrip("_").upper() == "LOG_2PI":
                    own.append(f"{module}:{node.lineno}")
    assert not own, "define log 2π once: use `from vijax._linalg import LOG_2PI` in " + ", ".join(own)


def test_linalg_helpers():
    import jax.numpy as jnp
    import numpy as np

    from vijax import _linalg

    assert _linalg.LOG_2PI == pytest.approx(1.8378770664093453, rel=1e-15)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(5, 5))
    P = jnp.asarray(A @ A.T + 5 * np.eye(5))
    R = _linalg.reversed_cholesky(P)
    np.testing.assert_allclose(np.tril(np.asarray(R), -1), 0.0)
    np.testing.assert_allclose(R @ R.T, P, rtol=1e-12)
    C = _linalg.inverse_factor(R)
    np.testing.assert_allclose(np.tril(np.asarray(C), -1), 0.0, atol=1e-14)
    np.testing.assert_allclose(C.T @ C, np.linalg.inv(np.asarray(P)), rtol=1e-10)
    L = jnp.linalg.cholesky(jnp.asarray(A @ A.T + np.eye(5)))
    CB = _linalg.inverse_factor(R, L)
    np.testing.assert_allclose(np.tril(np.asarray(CB), -1), 0.0, atol=1e-13)
    np.testing.assert_allclose(CB.T @ CB, L @ np.linalg.inv(np.asarray(P)) @ L.T, rtol=1e-10)
    new, old = {"a": jnp.ones(3), "b": (jnp.array(2.0),)}, {"a": jnp.zeros(3), "b": (jnp.array(5.0),)}
    picked = _linalg.select(jnp.array(False), new, old)
    np.testing.assert_array_equal(picked["a"], 0.0)
    assert float(picked["b"][0]) == 5.0
    trace = _linalg.nan_trace(3, jnp.float64, jnp.array(1.5))
    assert trace.shape == (4,) and float(trace[0]) == 1.5 and bool(jnp.all(jnp.isnan(trace[1:])))


def test_families_declare_concavity_and_gkl_picks_the_solver():
    """Covariance families import no solver: they declare ``concave`` and `GKL` chooses from it."""
    import vijax as vj

    cov = vj.covariance
    for family in (cov.Full(), cov.Diagonal(), cov.Banded(2), cov.Chevron(1), cov.Subspace(1)):
        assert family.concave
        assert isinstance(vj.GKL(covariance=family)._solver(), vj.solvers.NewtonCG)
    assert not cov.FactorAnalysis(2).concave
    assert isinstance(vj.GKL(covariance=cov.FactorAnalysis(2))._solver(), vj.solvers.LBFGS)
    given = vj.solvers.Newton()
    assert vj.GKL(covariance=cov.FactorAnalysis(2), solver=given)._solver() is given


def test_subspace_update_uses_what_the_method_passes_in():
    """`Subspace.update(factor, mean, objective, curvature)`: the projected-gradient basis update never
    lowers the objective it is given (at the factor's C; the factor returned then refits C to the new
    basis); the fixed point takes the top eigenvectors of the curvature's sites."""
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    import vijax as vj

    D, K = 5, 2
    rng = np.random.default_rng(1)
    A = rng.normal(size=(D, D))
    target = jnp.asarray(A @ A.T / D + np.eye(D))
    family = vj.covariance.Subspace(K, basis_update="gradient")
    factor = vj.covariance.SubspaceFactor(jnp.eye(D, K), jnp.diag(jnp.array([3.0, 2.0])), jnp.array(1.0))
    objective = lambda f: -jnp.sum((f.dense() - target) ** 2)
    updated = family.update(factor, jnp.zeros(D), objective, None)
    assert float(objective(eqx.tree_at(lambda f: f.basis, factor, updated.basis))) > float(objective(factor)) + 1e-3
    np.testing.assert_allclose(updated.basis.T @ updated.basis, np.eye(K), atol=1e-12)

    class Sites:  # the part of a `Curvature` the fixed point uses: the operator Σ_n w_n h_n h_nᵀ
        def sites_mv(self, X):
            return target @ X

    fixed = vj.covariance.Subspace(K).update(factor, jnp.zeros(D), objective, Sites())
    top = np.linalg.eigh(np.asarray(target))[1][:, ::-1][:, :K]
    projector = lambda E: np.asarray(E) @ np.asarray(E).T
    np.testing.assert_allclose(projector(fixed.basis), projector(top), atol=1e-6)
