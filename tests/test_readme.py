"""The README's Python code blocks run as written, in order, in one namespace (as a reader pastes them)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"


def python_blocks(text):
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_python_blocks():
    assert len(python_blocks(README.read_text())) >= 4


def test_readme_code_blocks_run(capsys):
    pytest.importorskip("sklearn")
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(python_blocks(README.read_text())):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as err:  # say which block failed
            raise AssertionError(f"README python block {i + 1} failed:\n{block}") from err
    out = capsys.readouterr().out
    # G-KL gives a bound, Laplace an approximation; the sklearn estimator fitted the same posterior mean.
    post, lap = namespace["post"], namespace["lap"]
    assert bool(post.is_lower_bound) and not bool(lap.is_lower_bound)
    assert "True" in out
    clf = namespace["clf"]
    assert abs(float(clf.intercept_)) < 5.0 and clf.coef_.shape == (3,)
