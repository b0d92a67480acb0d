"""Execute every tutorial notebook so that none of them can rot.

Each notebook runs in a fresh kernel with the notebooks folder as its working directory (the tutorials on
UCI data look for ``shared/data/uci`` or ``data/uci`` in that folder's parents). Run with
``python -m pytest -p no:xdist -m slow tests/test_notebooks.py``; the notebooks take 20–50 s each
on two CPU cores.
"""

import json
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow  # minutes per notebook: run with `python -m pytest -m slow`
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    # Run the kernel on this interpreter (the test environment), whatever kernels are installed elsewhere.
    spec_dir = tmp_path / "kernels" / "vijax-test"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "vijax-test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="vijax-test",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
