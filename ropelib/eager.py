"""The eager route from the public API to the kernel.

Under torch.compile, torch.export, make_fx, torch.func, torch.jit.trace and TorchDispatchModes the
public functions call ropelib's operators (ropelib.ops): that is what those systems understand.
A plain eager call would reach the same planner and kernel through the PyTorch dispatcher, the
operators' Python wrappers and Triton's launcher, which together cost several times the kernel
at decode sizes. So a plain eager call takes a shorter way to the same planner and kernel:

* **Signatures.** The first call with a given signature (every argument's type, shape, strides,
  dtype, device and requires_grad; the options; whether grad mode is on) is checked in full and
  planned. Later calls with that signature reuse the check and the plan: everything they depend
  on is in the signature. A signature holds no tensor, data pointer, version or value.
* **Every call** still does what depends on more than its signature: index value checks (where
  `set_index_checks` wants them), the autograd checks of an in-place call, the overlap of q and k
  in place, and copies of tensors made under inference_mode before they are saved for backward.
* **Gradients** go through one autograd.Function whose backward is the same route with the
  rotation reversed. It is itself differentiable, so double backward works. The tables and index
  tensors are saved for backward: changing one in place before backward raises autograd's error.
"""
from typing import Callable, Optional

import torch

from .kernels import launch
from .kernels.launch import Positions, Table, View, plan

MAX_SIGNATURES = 1024


def _functorch_active() -> bool:
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def active() -> bool:
    """Is this a plain eager call (no compiler, tracer, transform or dispatch mode at work)?"""
    return not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
                or torch._C._get_tracing_state() or _functorch_active())


def signature(head: tuple, tensors: tuple) -> Optional[tuple]:
    """The call's signature, or None when it cannot take the eager route (a tensor subclass,
    something that is not a tensor: the full checks will say what is wrong with it)."""
    try:
        hash(head)
    except TypeError:
        return None
    sig = [*head, torch.is_grad_enabled()]
    for t in tensors:
        if t is None:
            sig.append(None)
        elif type(t) is torch.Tensor:
            sig.append((t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        else:
            return None
    return tuple(sig)


class Signatures:
    """Planned rotations by signature (bounded: cleared when full)."""

    def __init__(self):
        self.entries = {}

    def get(self, sig):
        return self.entries.get(sig)

    def put(self, sig, entry):
        if len(self.entries) >= MAX_SIGNATURES:
            self.entries.clear()
        self.entries[sig] = entry
        return entry

    def clear(self) -> None:
        self.entries.clear()


SIGNATURES = Signatures()


def _stand_in(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A storage-less tensor with t's shape, strides and dtype (for planning a reverse)."""
    if t is None:
        return None
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


class Rotation:
    """One planned rotation of one or two tensors (q, or q and k) for one signature.

    A call's tensors are (xs..., outs..., rest...) with rest = (table, sin, k_table, k_sin,
    position_ids, cu_seqlens, start_positions) as the caller gave them. `slots[i]` says where
    the kernel's i-th pointer comes from: None, or (index into the call's tensors, copy?) where
    copy means "made contiguous first" (what the checks did to that argument).
    """
    __slots__ = ("launch", "slots", "n", "out_dtype", "in_place", "backward", "_planned",
                 "reverses", "view4")

    def __init__(self, *, xs4, outs4, tables, positions, slots, out_dtype, in_place, backward,
                 interleaved, view4: Callable, q_view=None):
        self.n = len(xs4)
        q = q_view or View.of(xs4[0])
        pairs = [(q, View.of(outs4[0]))] + ([(View.of(xs4[1]), View.of(outs4[1]))]
                                             if self.n > 1 else [])
        self.launch, _ = plan(pairs[0][0], pairs[0][1], tables[0], positions,
                              R=tables[0].cos.shape[-1], interleaved=interleaved,
                              backward=backward, copy_pass=not in_place,
                              k=pairs[1][0] if self.n > 1 else None,
                              k_out=pairs[1][1] if self.n > 1 else None,
                              k_table=tables[1] if self.n > 1 else None)
        self.slots, self.out_dtype, self.in_place = slots, out_dtype, in_place
        self.backward, self.view4 = backward, view4
        # for planning reverses: the tables and positions without their data
        self._planned = ([Table(_stand_in(t.cos), _stand_in(t.sin)) for t in tables],
                         Positions(*(_stand_in(p) for p in positions[:3]), *positions[3:]),
                         interleaved)
        self.reverses = {}

    def empty(self) -> bool:
        return self.launch.args["S"] == 0 or self.launch.args["B"] == 0

    def launch_on(self, tensors: tuple) -> None:
        """Run the planned kernel on a call's tensors (xs, outs, rest)."""
        if self.empty():
            return
        pointers = [None if slot is None else
                    (tensors[slot[0]].contiguous() if slot[1] else tensors[slot[0]])
                    for slot in self.slots]
        if launch.INTERPRET:
            launch.run(self.launch, pointers)
        else:   # a plain eager call on a GPU (eager.active() chose this route)
            launch.DIRECT(self.launch, pointers)

    def __call__(self, xs: tuple, rest: tuple, *, grad: bool):
        """Rotate xs (returns the outputs, or xs when in place); through autograd when grad."""
        if grad:
            outs = Rotate.apply(self, len(xs), *xs, *rest)
            return outs if isinstance(outs, tuple) else (outs,)
        outs = xs if self.in_place else tuple(
            torch.empty_like(x, dtype=self.out_dtype, memory_format=torch.contiguous_format)
            for x in xs)
        self.launch_on((*xs, *outs, *rest))
        if self.in_place:
            for x in xs:
                torch.autograd.graph.increment_version(x)
        return outs

    def reverse(self, grads: tuple, x_dtype) -> "Rotation":
        """The rotation back, for gradients with these strides (planned once per signature)."""
        key = tuple((g.shape, g.stride(), g.dtype) if g is not None else None for g in grads)
        rev = self.reverses.get(key)
        if rev is None:
            rev = self.reverses[key] = self._plan_reverse(grads, x_dtype)
        return rev

    def _plan_reverse(self, grads: tuple, x_dtype) -> "Rotation":
        tables, positions, interleaved = self._planned
        present = [i for i, g in enumerate(grads) if g is not None]
        gs = [self.view4(grads[i]) for i in present]
        outs = [self.view4(torch.empty(grads[i].shape, dtype=x_dtype, device=grads[i].device))
                for i in present]
        # The reverse's call tensors are (gradients present, their outputs, rest): the rest
        # slots keep their meaning, shifted by the change in how many tensors precede them.
        shift = 2 * len(present) - 2 * self.n
        rest = [None if s is None else (s[0] + shift, s[1]) for s in self.slots[4:]]
        m = len(present)
        if m == 2:
            slots, use = [(0, False), (2, False), (1, False), (3, False)] + rest, tables
        else:   # one gradient: q's, or k's with k's table in q's place
            which = present[0]
            table_slots = rest[0:2] if which == 0 else rest[2:4]
            slots = [(0, False), (1, False), None, None] + table_slots + [None, None] + rest[4:]
            use = [tables[which]]
        return Rotation(xs4=gs, outs4=outs, tables=use, positions=positions, slots=slots,
                        out_dtype=x_dtype, in_place=False, backward=not self.backward,
                        interleaved=interleaved, view4=self.view4)


class Rotate(torch.autograd.Function):
    """xs -> rotated xs; backward rotates the gradients back (the same route, reversed)."""

    @staticmethod
    def forward(ctx, rotation: Rotation, n: int, *tensors):
        xs, rest = tensors[:n], tensors[n:]
        outs = rotation(xs, rest, grad=False)
        if rotation.in_place:
            ctx.mark_dirty(*xs)
        ctx.rotation, ctx.x_dtype = rotation, xs[0].dtype
        ctx.save_for_backward(*rest)
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        rest = ctx.saved_tensors
        present = tuple(g for g in grads if g is not None)
        if not present:
            return (None,) * (2 + len(grads) + len(rest))
        rev = ctx.rotation.reverse(grads, ctx.x_dtype)
        gx = rev(present, rest, grad=torch.is_grad_enabled())
        it = iter(gx)
        gxs = tuple(next(it) if g is not None else None for g in grads)
        return (None, None) + gxs + (None,) * len(rest)
