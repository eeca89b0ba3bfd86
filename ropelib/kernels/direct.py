"""Eager launches without Triton's per-call argument binding: the one place that relies on
Triton's compiled-kernel interface.

Triton's launcher (`kernel[grid](...)`, `JITFunction.run`) binds and specialises every argument
on every call and builds a cache key from them. Measured on an H100 host
(benchmarks/launch_cost.py): about 0.5 µs per argument; the finished kernel's 32 arguments,
called by name at decode size, cost 28.4 µs through it against 6.4 µs for its C launcher alone
and 12.3 µs through this module, while Transformer Engine's whole fused forward took 25.4 µs
in the same run (16 µs on another H100 host): through Triton's path an eager call would still
cost more than TE's.
A planned `Launch` fixes every argument except the pointers, so ropelib asks Triton once per
(Launch, alignment of the pointers) for the compiled kernel (Triton compiles it, or finds it in
its cache, and launches it), then starts later calls through that compiled kernel's launcher
with the pointers' current addresses and the current CUDA stream.

What it relies on (Triton 3.x, checked by `supported()` and in tests/test_direct_launch.py):
`kernel[grid](...)` returns the `CompiledKernel`; `compiled[grid]` returns a runner taking
every kernel argument in order (constexprs included, ignored) and a `stream=` keyword; a
pointer may be passed as an int address. Where that runner is, as in Triton 3.4 to 3.9, a thin
wrapper of `compiled.run(grid0, grid1, grid2, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)` (its source says so), the launcher calls
`compiled.run` itself. Triton specialises a pointer on 16-byte alignment, so alignment is part
of the key. When a launch hook is installed (Triton's profiler), or the interface is not there,
launches go through Triton's own path.
"""
import inspect
import warnings

import torch
import triton

# The current CUDA stream of a device, as an int (torch's C accessor where it has one).
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)

MAX_COMPILED = 4096


def supported() -> bool:
    """Does this Triton expose the compiled-kernel interface this module uses?"""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    major = int(triton.__version__.split(".")[0])
    return major == 3 and hasattr(CompiledKernel, "__getitem__")


_RUNTIME = getattr(getattr(triton, "knobs", None), "runtime", None)


def hooks_installed() -> bool:
    """Is a launch hook (Triton's profiler) installed? A hook is a function, or (newer Triton) a
    chain of them, empty when none is."""
    enter = getattr(_RUNTIME, "launch_enter_hook", None)
    leave = getattr(_RUNTIME, "launch_exit_hook", None)
    return bool(enter is not None and getattr(enter, "calls", True)
                or leave is not None and getattr(leave, "calls", True))


def addresses_and_alignment(pointers) -> tuple:
    """The pointers' addresses (None stays None) and a bit per pointer, 16-byte aligned or not
    (None counts as aligned): Triton compiles a kernel per alignment pattern."""
    addresses, aligned = [], 0
    for t in pointers:
        a = None if t is None else t.data_ptr()
        addresses.append(a)
        aligned = 2 * aligned + (a is None or a % 16 == 0)
    return addresses, aligned


def _takes_stream(runner) -> bool:
    try:
        return "stream" in inspect.signature(runner).parameters
    except (TypeError, ValueError):
        return False


_RUNNER_CALL = ("self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata,"
                " launch_metadata,")


def runner_is_thin() -> bool:
    """Is CompiledKernel's runner a thin wrapper of its C launcher (see the docstring)?"""
    try:
        from triton.compiler.compiler import CompiledKernel
        source = " ".join(inspect.getsource(CompiledKernel.__getitem__).split())
    except (ImportError, OSError, TypeError):
        return False
    return _RUNNER_CALL in source


def _c_launcher(compiled, grid: tuple):
    """A callable (stream, *args) that starts `compiled` on `grid` through its C launcher."""
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]

    def launch(stream, *args):
        run(g0, g1, g2, stream, function, packed, None, None, None, *args)
    return launch


class DirectLauncher:
    """Kernel launches from a planned Launch and its pointers (see the module docstring)."""

    def __init__(self, kernel, pointer_names: tuple):
        self.kernel = kernel
        self.pointer_names = pointer_names
        self.enabled = supported()
        self.compiled = {}    # (Launch, alignment) -> (start(stream, *args), non-pointer args)
        self._order = None    # the kernel's parameter names
        self.thin = runner_is_thin()

    def _params(self) -> tuple:
        if self._order is None:
            self._order = tuple(self.kernel.arg_names)
            assert self._order[:len(self.pointer_names)] == self.pointer_names, \
                "the kernel's pointer arguments must come first, in POINTERS order"
        return self._order

    def check_args(self, launch) -> None:
        """Raise unless the Launch names every argument after the pointers, defaulted ones
        included: the direct launch passes them all from launch.args, in the kernel's order."""
        missing = [n for n in self._params()[len(self.pointer_names):] if n not in launch.args]
        if missing:
            raise TypeError(f"a planned launch of {self.kernel.__name__} names no {missing}: "
                            "a planner bug (every argument after the pointers must be named)")

    def _through_triton(self, launch, pointers: tuple):
        return self.kernel[launch.grid](**dict(zip(self.pointer_names, pointers)), **launch.args,
                                        **launch.options())

    def __call__(self, launch, pointers: tuple) -> None:
        """Launch with these pointer tensors (or None), in the kernel's order."""
        if not self.enabled or hooks_installed():
            self._through_triton(launch, pointers)
            return
        addresses, aligned = addresses_and_alignment(pointers)
        hit = self.compiled.get((launch, aligned))
        if hit is not None:
            start, tail = hit
            start(current_stream(launch.device.index), *addresses, *tail)
            return
        self.check_args(launch)
        compiled = self._through_triton(launch, pointers)
        try:
            if self.thin:
                start = _c_launcher(compiled, launch.grid)
            else:
                runner = compiled[launch.grid]
                if not _takes_stream(runner):
                    self._disable("its runner takes no stream= keyword")
                    return
                start = (lambda runner: lambda stream, *args: runner(*args, stream=stream))(runner)
        except Exception as e:  # noqa: BLE001  (a Triton whose interface differs)
            self._disable(e)
            return
        names = self._params()[len(self.pointer_names):]
        if len(self.compiled) >= MAX_COMPILED:
            self.compiled.clear()
        self.compiled[(launch, aligned)] = (start, tuple(launch.args[n] for n in names))

    def _disable(self, why) -> None:
        self.enabled = False
        warnings.warn(f"ropelib: launching through Triton's own path ({why})", stacklevel=3)
