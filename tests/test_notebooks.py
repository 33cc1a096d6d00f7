"""The Colab notebooks in colab/: stored clean (valid nbformat v4, no outputs) and each runs.

The run tests execute every notebook with nbclient in a fresh "python3" kernel, with
TOOLVERSE_NB_SMOKE=1 (tiny sizes, well under a minute each) and the repo on PYTHONPATH.
"""

import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(REPO_ROOT, "colab")
NOTEBOOKS = ("quickstart.ipynb", "tool_graph_dusa.ipynb", "advantages.ipynb")


def _read(name: str):
    return nbformat.read(os.path.join(COLAB, name), as_version=nbformat.NO_CONVERT)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_clean(name):
    nb = _read(name)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"{name}: code cell {i} has stored outputs; strip them"
        assert cell.execution_count is None, f"{name}: code cell {i} has an execution count"
    first = code[0].source
    assert '"google.colab" in sys.modules' in first and "sys.path.insert(0, root)" in first
    assert 'SMOKE = os.environ.get("TOOLVERSE_NB_SMOKE") == "1"' in first


def test_python3_kernel_is_this_interpreter():
    # ipykernel's native spec says "python"; jupyter_client launches it as sys.executable.
    from jupyter_client.kernelspec import KernelSpecManager
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable), spec.argv


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TOOLVERSE_NB_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(os.path.join(COLAB, name), as_version=4)
    # The kernel must be this interpreter (the venv with the package's dependencies).
    nb.cells.insert(0, nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": REPO_ROOT}})
    client.execute()  # raises CellExecutionError naming the failing cell
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs).strip()
    assert printed == sys.prefix, f"kernel runs {printed!r}, tests run {sys.prefix!r}"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{name}: no figure was displayed"
