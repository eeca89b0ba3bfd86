"""Argument checks shared by every public entry point.

Each check raises before any kernel runs, names the argument and says what was expected.

Two kinds of check:
- **Shape, dtype, stride and device checks** read only tensor metadata. They are always on,
  cost no synchronisation and trace under torch.compile.
- **Index value checks** (positions inside the table, well-formed cu_seqlens) must read the
  index tensors' values. Reading a GPU tensor on the host waits for the GPU, so by default they
  run only where the values already sit in host memory (CPU tensors). `set_index_checks("on")`
  (or `ROPELIB_CHECK_INDICES=on`) checks GPU index tensors too, at one synchronisation per
  call: use it while debugging. Under torch.compile they never run. Whatever the setting, the
  kernel never reads outside the table: a token whose position lies outside it comes out NaN.
"""
import contextlib
import math
import numbers
import os

import torch

from .conventions import (ANGLE_DTYPES, FLOAT_DTYPES, INT_DTYPES,  # noqa: F401  (V.*)
                          LAYOUTS, MAX_HEAD_DIM)
from .runtime import check_kernel_device  # noqa: F401  (used as V.check_kernel_device)


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(t, name: str, *, dims=None, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if dims is not None and t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name} must be {want}-D, got shape {tuple(t.shape)}")


def check_int_tensor(t, name: str, dims) -> None:
    check_tensor(t, name, dims=dims, dtypes=None)
    if t.dtype not in INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")


def check_bool(v, name: str) -> None:
    if v is not True and v is not False:    # (isinstance(v, bool), with no builtin read)
        raise TypeError(f"{name} must be a bool, got {v!r}")


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
    for n in x.shape[1 if layout == "thd" else 2:]:
        if n == 0:
            raise ValueError(f"{name} has an empty head or feature dimension: {tuple(x.shape)}")


def table_2d(t, name: str, dtypes=FLOAT_DTYPES) -> torch.Tensor:
    """A table given as [P, R] or TE's [P, 1, 1, R] -> a [P, R] view."""
    check_tensor(t, name, dims=(2, 4), dtypes=dtypes)
    if t.dim() == 4:
        if t.shape[1] != 1 or t.shape[2] != 1:
            raise ValueError(f"{name} must be [P, 1, 1, R] (TE convention) or [P, R], "
                             f"got shape {tuple(t.shape)}")
        t = t[:, 0, 0, :]
    return kernel_table(t)


def kernel_table(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy where the kernels could not read it as it is: they read a table's
    features at stride 1, and a batch of tables [B, P, R] as one dense block."""
    dense_batch = t.dim() < 3 or t.shape[0] == 1 or t.stride(0) in (0, t.shape[1] * t.stride(1))
    return t if t.stride(-1) == 1 and dense_batch else t.contiguous()


def angle_table(freqs, name: str = "freqs") -> torch.Tensor:
    """Angles [P, 1, 1, R] or [P, R], float32 (float64 allowed) -> a [P, R] view."""
    check_tensor(freqs, name, dims=(2, 4), dtypes=None)
    if freqs.dtype not in ANGLE_DTYPES:
        raise TypeError(
            f"{name} must be float32 angles (float64 allowed), got {freqs.dtype}: angles rounded "
            f"to {str(freqs.dtype).replace('torch.', '')} are off by up to "
            f"{'0.4%' if freqs.dtype == torch.bfloat16 else '0.05%'} of the angle (radians at "
            "long positions); build them with ropelib.rope_freqs, or keep the table in float32 "
            "when the model runs in 16 bits (as Transformer Engine requires)")
    return table_2d(freqs, name, dtypes=None)


def cos_sin_pair(c: torch.Tensor, s: torch.Tensor, names=("cos", "sin")):
    """cos and sin tables of one shape and dtype, with one set of strides (the kernel reads both
    with it)."""
    if c.shape != s.shape:
        raise ValueError(f"{names[0]} and {names[1]} must have the same shape, got "
                         f"{tuple(c.shape)} and {tuple(s.shape)}")
    if c.dtype != s.dtype:
        raise TypeError(f"{names[0]} and {names[1]} must have the same dtype, got {c.dtype} "
                        f"and {s.dtype}")
    c, s = kernel_table(c), kernel_table(s)
    if c.stride() != s.stride():
        c, s = c.contiguous(), s.contiguous()
    return c, s


def hf_cos_sin(cos: torch.Tensor, sin: torch.Tensor, S, B, D, *, partial: str, hint: str = ""):
    """Hugging Face's cos and sin, already gathered at the tokens ([B or 1, S, D] or [S, D]),
    as the kernels read them: [B or 1, S, D] each, features at stride 1. HF's formula rotates
    the whole head; `partial` names the function for partial rotary, `hint` ends shape errors."""
    for t, name in ((cos, "cos"), (sin, "sin")):
        check_tensor(t, name, dims=(2, 3))
    c, s = cos_sin_pair(cos if cos.dim() == 3 else cos.unsqueeze(0),
                        sin if sin.dim() == 3 else sin.unsqueeze(0))
    if c.shape[-1] != D:
        raise ValueError(f"cos/sin last dim ({c.shape[-1]}) must equal head_dim ({D}): HF's "
                         f"formula rotates the whole head (use {partial} for partial rotary)")
    check_rotary_dim(D, D, "cos")
    if c.shape[1] != S or c.shape[0] not in (1, B):
        raise ValueError(f"cos/sin must be [batch or 1, seq={S}, {D}] or [seq, {D}], got "
                         f"{tuple(cos.shape)}{hint}")
    return c, s


def check_real(v, name: str, *, positive: bool = False) -> float:
    """A finite real number (> 0 when `positive`), as a Python float; `name` in the error."""
    if type(v) is float and (0.0 if positive else -math.inf) < v < math.inf:
        return v                            # (the common case, checked in one comparison)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__} ({v!r})")
    if type(v) is not float:    # (float() of a float constant would make it symbolic in Dynamo)
        v = float(v)
    # (comparisons, not math.isfinite: torch.compile(dynamic=True) may trace v as a symbol)
    if v != v or v in (float("inf"), float("-inf")) or (positive and v <= 0):
        raise ValueError(f"{name} must be a finite number{' > 0' if positive else ''}, got {v}")
    return v


def check_rotary_dim(R: int, D: int, name: str) -> None:
    if R <= 0 or R % 2:
        raise ValueError(f"the rotary dim (last dim of {name}) must be a positive even number, got {R}")
    if R > D:
        raise ValueError(f"the rotary dim (last dim of {name}) is {R}, larger than the head dim {D}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is larger than the supported {MAX_HEAD_DIM}")


def check_cp(cp_size, cp_rank) -> None:
    if type(cp_size) is not int or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
    if type(cp_rank) is not int or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be an int in [0, cp_size={cp_size}), got {cp_rank!r}")


def non_overlapping(t: torch.Tensor, shape=None, strides=None) -> bool:
    """True when no two elements of t (or of a layout: shape and strides) share memory (a
    precondition for writing in place)."""
    shape = t.shape if shape is None else shape
    strides = t.stride() if strides is None else strides
    # dims by stride, smallest first: an insertion sort of plain comparisons, because
    # torch.compile traces those with symbolic sizes (dynamic=True, or after a recompile for a
    # new batch size) but cannot sort symbolic keys; equal strides need no order (both fail)
    dims = []
    for st, n in zip(strides, shape):
        if n > 1:
            i = len(dims)
            while i > 0 and st < dims[i - 1][0]:
                i -= 1
            dims.insert(i, (st, n))
    need = 1
    for st, n in dims:
        if st < need:
            return False
        need = st * n
    return True


def memory_overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Could a and b share an element?

    Exact for two views with the same strides into one non-overlapping tensor (q and k as
    head slices of one projection: disjoint index boxes), conservative otherwise (any overlap of
    their address ranges counts)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def extent(t):
        lo = t.storage_offset()
        return lo, lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1
    (a0, a1), (b0, b1) = extent(a), extent(b)
    if a1 <= b0 or b1 <= a0 or a.element_size() != b.element_size():
        return a0 < b1 and b0 < a1
    if a.dim() != b.dim() or a.stride() != b.stride():
        return True
    if b0 < a0:
        a, b, a0, b0 = b, a, b0, a0
    # b's offset from a as an index shift along the shared strides, largest stride first
    rest, shift = b0 - a0, [0] * a.dim()
    for d in sorted(range(a.dim()), key=lambda d: -a.stride(d)):
        if a.stride(d) > 0:
            shift[d], rest = divmod(rest, a.stride(d))
    if rest != 0:
        return True
    # the union of both index boxes must itself be laid out without overlap for the shift to
    # be the only way to reach b's first element
    union = [max(na, sh + nb) for na, nb, sh in zip(a.shape, b.shape, shift)]
    if not non_overlapping(a, union, a.stride()):
        return True
    return all(sh < na for na, sh in zip(a.shape, shift))


# --- index value checks ---------------------------------------------------------------------

_INDEX_CHECK_MODES = ("auto", "on", "off")
_index_checks = os.environ.get("ROPELIB_CHECK_INDICES", "auto")
if _index_checks not in _INDEX_CHECK_MODES:
    raise ValueError(f"ROPELIB_CHECK_INDICES must be one of {_INDEX_CHECK_MODES}, "
                     f"got {_index_checks!r}")


def set_index_checks(mode: str):
    """When the values of index tensors (positions, cu_seqlens) are checked on the host.

    "auto" (the default): index tensors in CPU memory are checked, GPU ones are not (reading
    them would synchronise with the GPU); "on": all are checked, one synchronisation per call;
    "off": none. Never under torch.compile. Unchecked positions outside the table give NaN rows.
    Returns a context manager that restores the previous mode, so it also works as
    `with ropelib.set_index_checks("on"): ...`.
    """
    global _index_checks
    if mode not in _INDEX_CHECK_MODES:
        raise ValueError(f"mode must be one of {_INDEX_CHECK_MODES}, got {mode!r}")
    previous, _index_checks = _index_checks, mode

    @contextlib.contextmanager
    def restore():
        try:
            yield
        finally:
            set_index_checks(previous)
    return restore()


def index_checks() -> str:
    """The current mode of the index value checks ("auto", "on" or "off")."""
    return _index_checks


def check_no_grad_transform(what: str) -> None:
    """Refuse torch.func's grad, jacrev, jacfwd, jvp and hessian (not vmap) before a kernel
    runs: PyTorch's custom operators cannot take part in them, and traced through, the
    derivatives would come out zero without an error."""
    if not torch.compiler.is_compiling() and {"Grad", "Jvp"} & functorch_level():
        raise NotImplementedError(
            f"{what} does not run under torch.func's grad, jacrev, jacfwd, jvp or hessian: "
            "PyTorch's custom operators cannot take part in those transforms. Use "
            "torch.autograd.grad or loss.backward() (torch.vmap works)")


def functorch_level() -> set:
    """The torch.func transforms at work ("Vmap", "Grad", "Jvp", ...), outermost first."""
    stack = getattr(torch._C._functorch, "get_interpreter_stack", lambda: None)()
    return {str(i.key()).split(".")[-1] for i in stack} if stack else set()


def checks_wanted(on_host: bool) -> bool:
    """Does the current mode want the values of index tensors checked, for tensors all in host
    memory (on_host) or not? (`values_checkable` adds what else decides it.)"""
    return _index_checks == "on" or (_index_checks == "auto" and on_host)


def values_checkable(*tensors) -> bool:
    """Should the values of these index tensors be read on the host now?"""
    if torch.compiler.is_compiling():     # (first: a traced call reads nothing else here)
        return False
    present = [t for t in tensors if t is not None]
    if not checks_wanted(all(t.device.type == "cpu" for t in present)) or functorch_level():
        return False
    if _index_checks == "on":
        return not any(t.is_cuda for t in present) or not torch.cuda.is_current_stream_capturing()
    return True


def _check_range(t: torch.Tensor, limit: int, message: str) -> None:
    """Raise ValueError(message) unless every value of t lies in [0, limit) (one host read)."""
    if t.numel() == 0:
        return
    lo, hi = torch.stack([t.min(), t.max()]).tolist()
    if lo < 0 or hi >= limit:
        raise ValueError(message.format(lo=lo, hi=hi, P=limit))


def check_cu_seqlens(cu: torch.Tensor, total: int, cp_size: int, name="cu_seqlens") -> list:
    """cu_seqlens [n+1]: 0-based, non-decreasing, cu[-1] // cp_size == total local tokens.

    Returns the local sequence lengths."""
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
    return [n // cp_size for n in lens]


def check_index_values(*, S: int, B: int, P: int, layout: str, start_positions=None,
                       position_ids=None, cu_seqlens=None, cp_size: int = 1) -> None:
    """Positions inside the table of P rows, and well-formed cu_seqlens (reads the values)."""
    if position_ids is not None:
        _check_range(position_ids, P, "position_ids must lie in [0, {P}) (the table has {P} "
                     "rows), got values in [{lo}, {hi}]")
        return
    if layout == "thd":
        lens = check_cu_seqlens(cu_seqlens, S, cp_size)
        starts = start_positions.tolist() if start_positions is not None else [0] * len(lens)
        for i, (n, s0) in enumerate(zip(lens, starts)):
            if n and (s0 < 0 or s0 + n * cp_size > P):
                raise ValueError(
                    f"the positions of sequence {i} ({s0}..{s0 + n * cp_size - 1}, from cu_seqlens, "
                    f"start_positions and cp) must lie inside the table of {P} rows")
        return
    if start_positions is not None and B and S:     # (an empty sequence reads no rows, as in TE)
        _check_range(start_positions, P - S * cp_size + 1,
                     "start_positions + seq_len*cp_size must fit in the table of " f"{P} rows, "
                     "got start_positions in [{lo}, {hi}] with " f"seq_len={S}, cp_size={cp_size}")
