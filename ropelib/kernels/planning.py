"""What every kernel family shares on the host: a planned Launch, how it starts, and the
arithmetic of tiles and grids.

A planner (the finished RoPE kernels' in kernels/launch.py; multi-axis, QK-norm + RoPE and the
KV-cache write in their kernel modules) turns shapes, strides, dtypes and options into a
`Launch`; `start` runs it: eagerly through the direct launcher (kernels/direct.py), while
torch.compile or another tracer is at work through torch.library.wrap_triton, and in Triton's
interpreter as Python.
"""
import torch

from ..conventions import HF_LAYOUT
from ..runtime import INTERPRET
from .direct import DirectLauncher

I32_LIMIT = 2**31 - 1
# how a fresh output is laid out, for kernels/common.contiguous_strides: sbhd (and thd, B = 1),
# bshd, Hugging Face's bhsd
OUT_LAYOUT = {"sbhd": 0, "thd": 0, "bshd": 1, HF_LAYOUT: 2}
# outputs laid out as the inputs, with their strides (the QK-norm kernels); a plain int, as every
# launch argument is: torch.compile writes them into its generated code
OUT_AS_INPUT = -1


class Launch:
    """One planned launch of a kernel: the grid, the warps and every argument except the
    pointers, by name; the pointers' dtypes and device; the DirectLauncher of its kernel (for
    the finished RoPE kernels; other families pass theirs to `start`). Pointers are bound per call, so one
    Launch serves every call with the same shapes, strides, dtypes and options. `dtypes` must
    name every pointer's dtype: Triton compiles a kernel per dtype, and the direct launcher finds
    the compiled kernel by the Launch.

    Equal Launches compare and hash equal (used to find the compiled kernel of an eager launch).
    """
    __slots__ = ("grid", "num_warps", "args", "dtypes", "device", "launcher", "num_stages",
                 "early", "_key", "_hash")

    def __init__(self, grid: tuple, num_warps: int, args: dict, dtypes: tuple, device,
                 launcher=None, num_stages=None, early: bool = False):
        if num_warps < 1 or num_warps & (num_warps - 1):
            raise ValueError(f"num_warps must be a power of two (Triton's rule), got {num_warps}: "
                             "a planner bug")
        self.grid, self.num_warps, self.args = grid, num_warps, args
        self.dtypes, self.device, self.launcher = dtypes, device, launcher
        self.num_stages = num_stages    # software pipelining (GEMMs); None: Triton's default
        # programmatic dependent launch (sm_90+): the kernel may start before the one before
        # it ends, and must wait for it (griddepcontrol.wait) before touching memory
        self.early = early
        self._key = self._hash = None

    def options(self) -> dict:
        """The launch options Triton takes beside the kernel's arguments."""
        out = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            out["num_stages"] = self.num_stages
        if self.early:
            out["launch_pdl"] = True
        return out

    def key(self) -> tuple:
        if self._key is None:   # only for concrete sizes (an eager launch), never while tracing
            self._key = (self.grid, self.num_warps, self.num_stages, self.early,
                         tuple(self.args.items()), self.dtypes, self.device, id(self.launcher))
            self._hash = hash(self._key)
        return self._key

    def __eq__(self, other):
        return self is other or (isinstance(other, Launch) and self.key() == other.key())

    def __hash__(self):
        if self._hash is None:
            self.key()
        return self._hash


def pointer_dtypes(pointers) -> tuple:
    """Every pointer's dtype (None for a None pointer): a Launch's `dtypes`, since Triton
    compiles a kernel for each (a None pointer is a constant to it)."""
    return tuple(None if t is None else t.dtype for t in pointers)


# --- tiles and grids -----------------------------------------------------------------------

def needs_int64(tensors) -> bool:
    """Does an element offset into one of these tensors (any strides) come near int32's limit?"""
    return any(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)
               > I32_LIMIT - 1024 for t in tensors)


def pow2_at_least(n: int, cap: int) -> int:
    """min(cap, next power of two >= n), by comparisons only (n may be a symbolic size)."""
    p = 1
    while p < cap and p < n:
        p *= 2
    return p


def pow2_at_most(n: int) -> int:
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def cdiv(a, b):
    return (a + b - 1) // b


# --- starting a launch ------------------------------------------------------------------------

def is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"


def plain_eager(t: torch.Tensor) -> bool:
    """A plain tensor outside any tracing: the launch can go straight to the compiled kernel."""
    return (type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0)


def start(direct: DirectLauncher, launch: Launch, pointers: tuple) -> None:
    """Start direct.kernel (pointers in direct.pointer_names order): eagerly through ropelib's
    direct launcher (kernels/direct.py); while torch.compile or another tracer is at work,
    through torch.library.wrap_triton, so the Triton kernel itself lands in the graph; in the
    interpreter as Python on CPU tensors (and not at all when the op is only being evaluated
    for its output shapes). Every kernel family (RoPE, multi-axis, KV-cache write) starts here."""
    if len(pointers) != len(direct.pointer_names):
        raise TypeError(f"{direct.kernel.__name__} takes {len(direct.pointer_names)} pointers "
                        f"{direct.pointer_names}, got {len(pointers)}")
    q = next(p for p in pointers if p is not None)     # (a tensor the launch reads or writes)
    if INTERPRET:
        if not is_fake(q):
            direct.check_args(launch)   # (what the GPU's direct launch needs, checked here too)
            direct.kernel[launch.grid](**dict(zip(direct.pointer_names, pointers)),
                                       **launch.args, **launch.options())
        return
    if plain_eager(q):      # (by position: no dict of the pointers by name)
        direct(launch, pointers)
        return
    # (traced code launches as torch.compile does, never early: the kernel's wait is then a
    # no-op)
    options = {k: v for k, v in launch.options().items() if k != "launch_pdl"}
    torch.library.wrap_triton(direct.kernel)[launch.grid](
        **dict(zip(direct.pointer_names, pointers)), **launch.args, **options)
