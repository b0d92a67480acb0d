"""The user guide's Python code blocks run as written: each page's blocks in order, in one namespace.

Slow (each page compiles its own fits). A page whose blocks are fragments says so with the comment
``<!-- fragments: not run by tests/test_guides.py -->``.
"""

import pathlib
import re

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


ALL_PAGES = sorted(DOCS.rglob("*.md"))
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def _prose_lines(text):
    """The page's lines outside fenced code blocks, with their line numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_pages_render_as_written(page):
    """Two kinds of breakage the site shows and the Markdown hides: a sentence cut in two (a line that goes on
    in lower case after a full stop, e.g. the tail of a sentence left behind when its head moved to another
    page), and ``\\|`` inside a code span in a table (rendered literally: the escape is not processed there)."""
    problems, previous = [], ""
    for number, line in _prose_lines(page.read_text()):
        stripped = previous.rstrip()
        if (stripped.endswith(".") and not stripped.endswith(_ABBREVIATIONS) and not stripped.lstrip().startswith("|")
                and re.match(r"\s+[a-z]", line)):
            problems.append(f"line {number}: a sentence goes on after a full stop: {line.strip()[:60]!r}")
        if line.lstrip().startswith("|"):
            problems += [f"line {number}: a literal \\| in {span}" for span in re.findall(r"`[^`]*`", line) if "\\|" in span]
        previous = line
    assert not problems, problems
