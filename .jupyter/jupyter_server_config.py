# Jupyter settings for a ropelib checkout. The README's command puts this folder on Jupyter's
# config path (JUPYTER_CONFIG_PATH=$PWD/.jupyter), next to your own settings.
#
# Saving one of the numbered study notebooks (notebooks/NN-*.ipynb) writes it without outputs, the
# way it is committed: running and saving the notebooks leaves the checkout as it was (git status
# stays clean unless you change a cell), and a reopened notebook shows no stale widgets. Other
# notebooks you create are saved as usual. The same stripping is git's filter for notebooks
# (scripts/strip_notebook_outputs.py, turned on by `git config include.path ../.gitconfig`).
import importlib.util
import pathlib
import re
import warnings

_script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "strip_notebook_outputs.py"
_spec = importlib.util.spec_from_file_location("strip_notebook_outputs", _script)
_strip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_strip)
_STUDY_NOTEBOOK = re.compile(r"notebooks/\d\d-[^/]+\.ipynb")


def strip_study_notebooks(model, path, **kwargs):
    """pre_save_hook: a study notebook is saved as committed, without outputs."""
    if model.get("type") == "notebook" and _STUDY_NOTEBOOK.fullmatch(path.strip("/")):
        _strip.strip(model["content"])


# The contents manager receives this setting once per class of its hierarchy that is named
# ContentsManager; the second time traitlets warns that it overrides the (identical) first.
warnings.filterwarnings("ignore", message="Overriding existing pre_save_hook")
c.ContentsManager.pre_save_hook = strip_study_notebooks  # noqa: F821 (c: Jupyter's config)
