"""The user guide's Python code blocks run as written: each page's blocks in order, in one namespace.

Slow (each page compiles its own fits). A page whose blocks are fragments says so with the comment
``<!-- fragments: not run by tests/test_guides.py -->``.
"""

import pathlib

import pytest

from test_readme import python_blocks

DOCS = pathlib.Path(__file__).parent.parent / "docs"
PAGES = sorted([DOCS / "getting-started.md", *(DOCS / "guide").glob("*.md")])
FRAGMENTS = "<!-- fragments: not run by tests/test_guides.py -->"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_guide_code_blocks_run(page, monkeypatch, tmp_path):
    text = page.read_text()
    blocks = python_blocks(text)
    if not blocks or FRAGMENTS in text:
        pytest.skip("no complete code blocks on this page")
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)  # pages that save files save them here
    namespace = {"__name__": f"__guide_{page.stem}__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{page.name} python block {i + 1}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"{page.relative_to(DOCS)} python block {i + 1} failed:\n{block}") from err
