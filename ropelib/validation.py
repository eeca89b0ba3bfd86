"""Argument checks shared by every public entry point.

Each check raises before any kernel runs, names the argument and says what was expected. Checks
that need tensor *values* (position bounds, cu_seqlens) read a few integers back from the device
once per call; they are skipped while a CUDA graph is being captured, where the kernel's clamp
still keeps every read inside the table.
"""
import os
import weakref
from typing import Callable

import torch

from .reference import LAYOUTS
from .runtime import check_kernel_device  # noqa: F401  (used as V.check_kernel_device)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 1024


def check_tensor(t, name: str, *, dims=None, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {t.dtype}")
    if dims is not None and t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name} must be {want}-D, got shape {tuple(t.shape)}")


def check_int_tensor(t, name: str, dims) -> None:
    check_tensor(t, name, dims=dims, dtypes=None)
    if t.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")


def check_same_device(ref: torch.Tensor, ref_name: str, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; "
                             "put them on the same device")


def check_layout(x: torch.Tensor, layout: str, name: str = "x") -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    want = 3 if layout == "thd" else 4
    if x.dim() != want:
        dims = "[t, h, d]" if layout == "thd" else f"[{', '.join(layout)}]"
        raise ValueError(f"{name} must be {want}-D {dims} for layout={layout!r}, "
                         f"got shape {tuple(x.shape)}")
    if any(n == 0 for n in x.shape[1 if layout == "thd" else 2:]):
        raise ValueError(f"{name} has an empty head or feature dimension: {tuple(x.shape)}")


def table_2d(t: torch.Tensor, name: str) -> torch.Tensor:
    """A table given as [P, R] or TE's [P, 1, 1, R] -> a [P, R] view."""
    check_tensor(t, name, dims=(2, 4))
    if t.dim() == 4:
        if t.shape[1] != 1 or t.shape[2] != 1:
            raise ValueError(f"{name} must be [P, 1, 1, R] (TE convention) or [P, R], "
                             f"got shape {tuple(t.shape)}")
        t = t[:, 0, 0, :]
    return t


def cos_sin_pair(c: torch.Tensor, s: torch.Tensor):
    """cos and sin tables of one shape, with one set of strides (the kernel reads both with it)."""
    if c.shape != s.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(c.shape)} and {tuple(s.shape)}")
    if c.stride() != s.stride():
        c, s = c.contiguous(), s.contiguous()
    return c, s


def check_rotary_dim(R: int, D: int, name: str) -> None:
    if R <= 0 or R % 2:
        raise ValueError(f"the rotary dim (last dim of {name}) must be a positive even number, got {R}")
    if R > D:
        raise ValueError(f"the rotary dim (last dim of {name}) is {R}, larger than the head dim {D}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is larger than the supported {MAX_HEAD_DIM}")


def check_cp(cp_size, cp_rank) -> None:
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
    if not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be an int in [0, cp_size={cp_size}), got {cp_rank!r}")


def non_overlapping(t: torch.Tensor) -> bool:
    """True when no two elements of t share memory (a precondition for writing in place)."""
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)
    need = 1
    for st, n in dims:
        if st < need:
            return False
        need = st * n
    return True


CHECK_VALUES: bool = os.environ.get("ROPELIB_CHECK_VALUES", "1") == "1"


def check_values(enabled: bool) -> None:
    """Turn the checks of index *values* (positions inside the table, cu_seqlens) on or off.

    They are on by default. Each reads a few integers back from the GPU (a synchronisation) the
    first time a given index tensor is seen; results are remembered per tensor object and
    version, so tensors reused across layers and steps are checked once. Off, out-of-range
    positions are clamped to the table in the kernel (memory-safe, but a wrong answer).
    """
    global CHECK_VALUES
    CHECK_VALUES = bool(enabled)


def values_checkable(*tensors) -> bool:
    """Value checks read from the device; not allowed while capturing a CUDA graph."""
    if not CHECK_VALUES:
        return False
    if any(t is not None and t.is_cuda for t in tensors):
        return not torch.cuda.is_current_stream_capturing()
    return True


_SEEN: dict = {}


def remembered(t: torch.Tensor, extra: tuple, compute: Callable):
    """compute() once per (tensor object, its version, extra); later calls return the result.

    Index tensors (cu_seqlens, start_positions, position_ids) are usually reused for every
    layer: checking and deriving from them once keeps synchronisations out of the hot path.
    An in-place change of the tensor bumps its version and invalidates the entry.
    """
    key = (id(t), extra)
    hit = _SEEN.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    result = compute()
    if len(_SEEN) > 4096:
        for k in [k for k, v in _SEEN.items() if v[0]() is None]:
            del _SEEN[k]
        if len(_SEEN) > 4096:
            _SEEN.clear()
    _SEEN[key] = (weakref.ref(t), t._version, result)
    return result


def check_cu_seqlens(cu: torch.Tensor, total: int, cp_size: int, name="cu_seqlens") -> None:
    """cu_seqlens: [n+1] ints, 0-based, non-decreasing, cu[-1] // cp_size == total local tokens."""
    check_int_tensor(cu, name, dims=(1,))
    if cu.shape[0] < 2:
        raise ValueError(f"{name} must have at least 2 entries ([0, len0, ...]), got {cu.shape[0]}")
    if not values_checkable(cu):
        return
    v = cu.tolist()
    if v[0] != 0:
        raise ValueError(f"{name} must start at 0, got {v[0]}")
    lens = [b - a for a, b in zip(v, v[1:])]
    if any(n < 0 for n in lens):
        raise ValueError(f"{name} must be non-decreasing, got {v}")
    if cp_size > 1 and any(n % (2 * cp_size) for n in lens):
        raise ValueError(f"with cp_size={cp_size} every sequence length in {name} must be a "
                         f"multiple of 2*cp_size={2 * cp_size} (TE's dual-chunk split), got {lens}")
    if v[-1] // cp_size != total:
        raise ValueError(f"{name}[-1] // cp_size = {v[-1] // cp_size} must equal the number of "
                         f"tokens in t ({total})")
