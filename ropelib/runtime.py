"""Where ropelib's kernels run: on a CUDA GPU, or on the CPU through Triton's interpreter.

`TRITON_INTERPRET=1` must be set before Triton compiles anything (in practice: before
`import ropelib`). Nothing here touches the GPU at import time.
"""
import os
import tempfile
from pathlib import Path

import torch

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpreter_scalar_index() -> bool:
    """Let Triton's interpreter use a scalar tensor as an index (`range(b_lo, b_hi)` in a
    kernel) under a NumPy that refuses int() of an array of shape [1] (2.4 does: TypeError,
    only 0-dimensional arrays can be converted to Python scalars). Triton 3.6's interpreter
    keeps a scalar as such an array and converts it with int(array): there every ropelib kernel
    with a loop failed. Triton 3.9 converts int(array.squeeze()); that conversion is installed
    here whenever NumPy refuses the other (with Triton 3.9 it is the interpreter's own again).
    Returns whether it was installed by this call."""
    import numpy as np
    try:
        int(np.zeros(1, dtype=np.int32))
        return False                    # this NumPy converts arrays of shape [1]
    except TypeError:
        pass
    from triton.runtime import interpreter
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "ropelib_index", False):
        return False

    def patch_with_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    patch_with_index.ropelib_index = True
    interpreter._patch_lang_tensor = patch_with_index
    return True


if INTERPRET:
    _interpreter_scalar_index()


def on_gpu() -> bool:
    """True when kernels run compiled on a CUDA GPU (not in the interpreter)."""
    return (not INTERPRET) and torch.cuda.is_available()


def default_device() -> str:
    """The device notebooks and tests put tensors on: "cuda" on a GPU, else "cpu" (interpreter)."""
    return "cuda" if on_gpu() else "cpu"


def mode() -> str:
    """A one-line description of the execution mode, for notebooks and benchmark headers."""
    if on_gpu():
        return f"GPU ({torch.cuda.get_device_name()})"
    if INTERPRET:
        return "CPU, Triton interpreter (TRITON_INTERPRET=1)"
    return "CPU without the interpreter: kernels cannot run (set TRITON_INTERPRET=1 before import)"


def check_kernel_device(t: torch.Tensor, name: str) -> None:
    """Raise a clear error when a kernel cannot run on `t`'s device."""
    if t.device.type == "cuda":
        if INTERPRET:
            raise ValueError(
                f"{name} is on {t.device}, but TRITON_INTERPRET=1 runs kernels on the CPU: "
                "move the tensors to the CPU or unset TRITON_INTERPRET before importing ropelib"
            )
        return
    if t.device.type == "cpu":
        if not INTERPRET:
            raise ValueError(
                f"{name} is a CPU tensor, but Triton kernels run on the CPU only through the "
                "interpreter: set TRITON_INTERPRET=1 before importing ropelib, or move it to CUDA"
            )
        return
    raise ValueError(f"{name} is on {t.device}; ropelib's kernels need a CUDA or CPU tensor")


def figures_dir() -> Path:
    """Where the notebooks save the figures and CSVs they draw.

    A scratch folder (under the system's temp dir), so that running a notebook leaves a
    checkout as it was; the checkout's `figures/` only with ROPELIB_WRITE_FIGURES=1, to
    regenerate the committed figures on purpose. The notebooks show every figure inline either
    way; their markdown links show the committed ones.
    """
    if os.environ.get("ROPELIB_WRITE_FIGURES") == "1":
        path = Path(__file__).resolve().parents[1] / "figures"
    else:
        path = Path(tempfile.gettempdir()) / "ropelib-figures"
    path.mkdir(parents=True, exist_ok=True)
    return path
