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
* **Cos/sin rows kept between calls.** The two-pass route for large tensors (kernels/flat.py)
  first writes the fp32 cos and signed sine rows of the call's tokens from the caller's table.
  Where positions are the token index, those rows depend only on that table and the plan, so
  the eager route keeps the last TABLE_ROWS_KEPT of them (S x R x 8 bytes each, at most
  TABLE_ROWS_BYTES in all; see `TableRows`) and a later call with the same table tensor,
  unchanged, on the same stream skips the pre-pass: every layer of a model after the first, in
  the forward and in the backward.
  Never while a CUDA graph is being captured (a graph must not read memory it does not own),
  nor from a table made under inference_mode (no version counter tells a change). Where only
  kept rows make the two passes pay (at batch 1 with 32 heads, rows written and read every
  call would add an eighth to the bytes moved), such a call runs the finished kernel instead
  (`EagerTwoPass`). The QKV projection's forward keeps its pre-pass rows here too
  (qkv_linear._kept_rows).
"""
import operator
import weakref
from collections import OrderedDict
from typing import Optional

import torch

from . import ops
from .kernels import direct, planning
from .kernels.launch import TWO_PASS_POINTERS, Launch, Positions, Table, plan, pointer_names
from .kernels.launch import output_row as launch_output_row

MAX_SIGNATURES = 1024
TABLE_ROWS_KEPT = 4       # the two-pass route's cos/sin rows kept between eager calls,
TABLE_ROWS_BYTES = 256 << 20    # at most this many bytes of them


_PEEK_INTERPRETER_STACK = getattr(torch._C._functorch, "peek_interpreter_stack", None)
_CONTIGUOUS = torch.contiguous_format


def _functorch_active() -> bool:
    return _PEEK_INTERPRETER_STACK is not None and _PEEK_INTERPRETER_STACK() is not None


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
    """Every plan ropelib keeps between calls: planned calls by signature, of every public
    function that takes the eager route (each signature starts with its function's name), and
    the QKV projection's launches (keys starting "qkv_forward", "qkv_gemm", "qkv_cos_sin_rows",
    "rotate_into", "undo_norm_rope": ropelib/qkv_plan.py says what each is keyed on).
    clear() drops them all: the one thing to call after changing a tile table or a planner.
    Bounded: cleared when full. `epoch` counts the clearings: a plan held outside the entries
    (a QKV forward's ForwardPlan, kept on its autograd context for the backward) serves only
    while the epoch it was made in lasts."""

    def __init__(self):
        self.entries = {}
        self.epoch = 0
        self.get = self.entries.get      # get(sig): the entry or None (the dict's own, no frame)

    def put(self, sig, entry):
        if len(self.entries) >= MAX_SIGNATURES:
            self.clear()
        self.entries[sig] = entry
        return entry

    def clear(self) -> None:
        self.entries.clear()
        self.epoch += 1


SIGNATURES = Signatures()


def _stand_in(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A storage-less tensor with t's shape, strides and dtype (for planning a reverse)."""
    if t is None:
        return None
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


class EagerLaunch:
    """Eager starts of one planned Launch of any kernel family (its DirectLauncher given):
    straight to the compiled kernel known for the pointers' alignment (kernels/direct.py), past
    the launcher's own lookup; in the interpreter, the kernel as Python."""
    __slots__ = ("direct", "launch", "_starts", "_device")

    def __init__(self, direct_launcher, planned):
        self.direct, self.launch = direct_launcher, planned
        self._starts = {}      # pointer alignment -> (start(stream, *args), the other args)
        self._device = planned.device.index

    def __call__(self, pointers) -> None:
        if planning.INTERPRET:
            planning.start(self.direct, self.launch, pointers)
            return
        addresses, aligned = direct.addresses_and_alignment(pointers)
        hit = self._starts.get(aligned)
        if hit is not None and not direct.hooks_installed():
            start, tail = hit
            start(direct.current_stream(self._device), *addresses, *tail)
            return
        self.direct(self.launch, pointers)
        found = self.direct.compiled.get((self.launch, aligned))
        if found is not None:
            self._starts[aligned] = found


class TableRows:
    """The two-pass route's pre-pass output (fp32 cos and s' rows, kernels/flat.py; with its
    flags per row, whether they are all 0: PairsEqual) of the last
    TABLE_ROWS_KEPT eager calls whose positions are the token index, by (plan, table, stream).

    A kept entry serves a call only if it is the same plan (the same EagerTwoPass object) and
    the same table tensor (its base; both held weakly, so a new object at a recycled id or
    address never matches), at the same address, not written since (its version counter), and
    the call runs on the same stream (the rows were written in that stream's order, and are
    freed in it). Inference tensors have no version counter: they are never kept."""

    def __init__(self):
        self.entries = OrderedDict()    # key -> (weakrefs to the plan and the tables, the rows,
        self.bytes = 0                  #         their bytes)

    @staticmethod
    def keeps(tables: tuple) -> bool:
        """Can rows made from `tables` be kept now? Not from inference tensors (no version
        counter to tell a change by), and not while a CUDA graph is being captured."""
        if any(t.is_inference() for t in tables):
            return False
        return tables[0].device.type != "cuda" or not torch.cuda.is_current_stream_capturing()

    @staticmethod
    def _key(owner, tables: tuple) -> tuple:
        key = [id(owner)]
        for t in tables:
            key += (t.data_ptr(), t._version)
        t = tables[0]
        if t.device.type == "cuda":
            key.append(direct.current_stream(t.device.index))
        return tuple(key)

    def get(self, owner, tables: tuple):
        """(key, the kept rows or None) for `owner` (an EagerTwoPass: one plan) reading `tables`
        (angles, or cos and sin), which the caller found `keeps` allows."""
        key = self._key(owner, tables)
        hit = self.entries.get(key)
        if hit is None:
            return key, None
        refs, rows, size = hit
        if any(ref() is not obj for ref, obj in zip(refs, (owner, *map(_base, tables)))):
            del self.entries[key]
            self.bytes -= size
            return key, None
        self.entries.move_to_end(key)
        return key, rows

    def put(self, key, owner, tables: tuple, rows: tuple) -> None:
        size = sum(r.numel() * r.element_size() for r in rows if isinstance(r, torch.Tensor))
        if size > TABLE_ROWS_BYTES:
            return
        self.entries[key] = (tuple(weakref.ref(o) for o in (owner, *map(_base, tables))), rows,
                             size)
        self.bytes += size
        while len(self.entries) > TABLE_ROWS_KEPT or self.bytes > TABLE_ROWS_BYTES:
            self.bytes -= self.entries.popitem(last=False)[1][2]

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class PairsEqual:
    """Are all of kept rows' flags 0 (no row has a pair whose members differ)? Asked without
    waiting for the device: the flags' reduction is copied to pinned host memory behind an
    event when the rows are made, and read once the event has passed; until then the answer
    is no. On the CPU (the interpreter) it is read at once."""
    __slots__ = ("_host", "_event", "value")

    def __init__(self, flags: torch.Tensor):
        differ = flags.any()
        if flags.device.type != "cuda":
            self.value, self._host, self._event = not bool(differ), None, None
            return
        self.value = None
        self._host = torch.empty((), dtype=torch.bool, pin_memory=True)
        self._host.copy_(differ, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def known(self) -> bool:
        """True once every flag is known to be 0."""
        if self.value is None:
            if not self._event.query():
                return False
            self.value = not bool(self._host)
            self._host = self._event = None
        return self.value


def _base(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns t's memory (t itself unless t is a view)."""
    return t._base if t._base is not None else t


TABLE_ROWS = TableRows()


class EagerTwoPass:
    """Eager starts of a planned two-pass rotation (kernels/launch.TwoPass): the pre-pass (unless
    its rows are kept from an earlier call, TableRows) and the flat pass, each through an
    EagerLaunch as the finished kernel's one launch.

    `unwritten`: the finished kernel's launch for the same call, where the route was taken only
    because the rows would be kept (planned with rows_kept; without it, the finished kernel).
    A call whose rows cannot be kept (a table made under inference_mode, a CUDA graph being
    captured) takes it: the pre-pass would write its rows every call, and at batch 1 that costs
    more than the finished kernel (s16k b1 bf16 on an H200, a call replayed from a CUDA graph:
    76.6 us with the pre-pass and the flat pass, 68.7 with the finished kernel;
    benchmarks/results/b1_launch_probe-*)."""
    __slots__ = ("route", "_index_pass", "_table_pass", "_rotate_pass", "_rotate_equal",
                 "_unwritten", "__weakref__")

    def __init__(self, route, unwritten: Optional[Launch] = None):
        self.route = route
        self._unwritten = None if unwritten is None else (
            EagerLaunch(unwritten.launcher, unwritten),
            operator.itemgetter(*(TWO_PASS_POINTERS.index(name)
                                  for name in unwritten.launcher.pointer_names)))
        self._rotate_pass = EagerLaunch(route.rotate_pass.launcher, route.rotate_pass)
        equal = route.rotate_pass_equal
        self._rotate_equal = None if equal is None else EagerLaunch(equal.launcher, equal)
        self._table_pass, self._index_pass = (
            EagerLaunch(p.launcher, p) if p is not None else None
            for p in (route.table_pass, route.index_pass))

    def __call__(self, pointers) -> None:
        q, q_out, k, k_out, cos, sin, position_ids, cu_seqlens, start = pointers
        tables = (cos,) if sin is None else (cos, sin)
        keeps = TableRows.keeps(tables)
        if self._unwritten is not None and not keeps:
            finished, pick = self._unwritten
            finished(pick(pointers))
            return
        token_rows = None
        (position_ids, cu_seqlens, start), sequences = self.route.positions_split(
            position_ids, cu_seqlens, start)
        if self._index_pass is not None:    # rows by position: the pre-pass's rows are kept
            token_rows = self.route.new_index(q.device)
            self._index_pass((position_ids, cu_seqlens, start, token_rows))
            position_ids = cu_seqlens = start = None
        flags, rotate = None, self._rotate_pass
        if self._table_pass is not None:
            plain = position_ids is None and cu_seqlens is None and start is None
            key, kept = TABLE_ROWS.get(self, tables) if plain and keeps else (None, None)
            if kept is None:
                # the rows, and (rotate-half) the flag per row saying where member b's entries
                # were written
                rows = self.route.new_rows(q.device)
                self._table_pass(self.route.table_pass_pointers(
                    (cos, sin, position_ids, cu_seqlens, start), rows))
                cos, sin, flags = rows
                if key is not None:
                    TABLE_ROWS.put(key, self, tables, rows + (
                        PairsEqual(flags) if self._rotate_equal is not None else None,))
            else:
                cos, sin, flags, equal = kept
                if equal is not None and equal.known():     # no row's pairs differ
                    flags, rotate = None, self._rotate_equal
        rotate((q, q_out, k, k_out, cos, sin, token_rows if sequences is None else sequences,
                flags))


class PlannedRotation:
    """One planned rotation of one or two tensors (q, or q and k) for one signature.

    A call gives xs (q, or q and k), outputs made here (or xs when in place) and `reads`: the
    tables and index tensors the kernel reads, as the caller gave them. `pointer_sources` says
    which kernel pointer reads which of them: (pointer name, index into reads, copy?) where copy
    means "made contiguous first" (what the checks did to that argument).
    """
    __slots__ = ("launch", "n", "pointer_sources", "x_dtype", "out_dtype", "in_place", "backward",
                 "layout", "whole_grads", "_planned", "_start", "_names", "_pick", "_copies",
                 "_reverses", "empty")

    def __init__(self, *, xs, outs, table, positions, pointer_sources, out_dtype, in_place,
                 backward, interleaved, layout: str, rows_kept: bool = True):
        self.n = len(xs)
        view = ops.kernel_view
        outs = [None] * self.n if in_place else outs      # in place: no outputs of their own
        k, k_out = (xs[1], outs[1]) if self.n > 1 else (None, None)
        self.launch, _ = plan(view(xs[0], layout), view(outs[0], layout), table, positions,
                              R=table.cos.shape[-1], interleaved=interleaved, backward=backward,
                              layout=layout, k=view(k, layout), k_out=view(k_out, layout),
                              rows_kept=rows_kept)
        self.pointer_sources = tuple(pointer_sources)
        # (the signature's: xs of every call have this dtype, and gradients the outputs')
        self.x_dtype, self.out_dtype, self.in_place = xs[0].dtype, out_dtype, in_place
        self.backward, self.layout = backward, layout
        # One table per axis is read by the two-pass route only, which takes q and k together
        # and contiguous: its reverse needs every gradient (zeros for an output outside the
        # loss), contiguous.
        self.whole_grads = table.axes is not None
        x4 = ops.view4(xs[0], layout)
        self.empty = x4.shape[0] == 0 or x4.shape[1] == 0
        self._names = pointer_names(self.launch)
        # Each kernel pointer's place in (*xs, *outs, *reads, None), picked in one C call per
        # launch; `_copies`: the places of the reads the checks made contiguous.
        places = {"q_ptr": 0, "q_out_ptr": None if in_place else self.n}
        if self.n == 2:
            places.update(k_ptr=1, k_out_ptr=None if in_place else 3)
        reads_at = self.n if in_place else 2 * self.n
        places.update((name, reads_at + j) for name, j, _ in self.pointer_sources)
        none_at = reads_at + len({j for _, j, _ in self.pointer_sources})
        self._pick = operator.itemgetter(*(none_at if places.get(name) is None else places[name]
                                           for name in self._names))
        self._copies = tuple(reads_at + j for _, j, copy in self.pointer_sources if copy)
        if isinstance(self.launch, Launch):
            self._start = EagerLaunch(self.launch.launcher, self.launch)
        else:       # the finished kernel where only kept rows made two passes pay
            unwritten, _ = plan(view(xs[0], layout), view(outs[0], layout), table, positions,
                                R=table.cos.shape[-1], interleaved=interleaved,
                                backward=backward, layout=layout, k=view(k, layout),
                                k_out=view(k_out, layout))
            self._start = EagerTwoPass(self.launch,
                                       unwritten if isinstance(unwritten, Launch) else None)
        # for planning reverses: the table and positions without their data
        self._planned = (Table(_stand_in(table.cos), _stand_in(table.sin), table.axes),
                         Positions(*(_stand_in(p) for p in positions[:3]), *positions[3:]),
                         interleaved)
        self._reverses = {}    # gradient strides -> PlannedRotation

    def run(self, xs: tuple, reads: tuple) -> tuple:
        """Rotate xs eagerly, outside autograd: returns the outputs (xs when in place)."""
        if self.in_place:
            if not self.empty:
                args = (*xs, *reads, None)
                self._start(self._pick(self._copied(args) if self._copies else args))
            for x in xs:
                torch.autograd.graph.increment_version(x)
            return xs
        # (one or two outputs, spelt out: no comprehension's frame on every call)
        if self.n == 1:
            outs = (torch.empty_like(xs[0], dtype=self.out_dtype, memory_format=_CONTIGUOUS),)
        else:
            q, k = xs
            outs = (torch.empty_like(q, dtype=self.out_dtype, memory_format=_CONTIGUOUS),
                    torch.empty_like(k, dtype=self.out_dtype, memory_format=_CONTIGUOUS))
        if not self.empty:
            args = (*xs, *outs, *reads, None)
            self._start(self._pick(self._copied(args) if self._copies else args))
        return outs

    def run_into(self, xs: tuple, outs: tuple, reads: tuple) -> None:
        """Rotate xs into outs of the caller's, with the strides planned for (fresh, or column
        slices of one token-major buffer: `rotate_into`)."""
        if not self.empty:
            args = (*xs, *outs, *reads, None)
            self._start(self._pick(self._copied(args) if self._copies else args))

    def _copied(self, args: tuple) -> tuple:
        """args, (*xs, *outs unless in place, *reads, None): the tuple the kernel's pointers are
        picked from, with the reads the checks made contiguous made so."""
        return tuple(a.contiguous() if i in self._copies else a for i, a in enumerate(args))

    def reverse(self, grads: tuple) -> "PlannedRotation":
        """The rotation back, for gradients with these strides (planned once per signature;
        their dtype is the outputs', autograd's rule)."""
        if self.n == 1:     # (the gradient is there: Rotate.backward asks only then)
            key = grads[0].stride()
        else:
            q, k = grads
            key = (None if q is None else q.stride(), None if k is None else k.stride())
        rev = self._reverses.get(key)
        if rev is None:
            rev = self._reverses[key] = self._plan_reverse(grads)
        return rev

    def _plan_reverse(self, grads: tuple) -> "PlannedRotation":
        table, positions, interleaved = self._planned
        present = [g for g in grads if g is not None]
        outs = [torch.empty(g.shape, dtype=self.x_dtype, device=g.device) for g in present]
        return PlannedRotation(xs=present, outs=outs, table=table, positions=positions,
                        pointer_sources=self.pointer_sources, out_dtype=self.x_dtype,
                        in_place=False, backward=not self.backward, interleaved=interleaved,
                        layout=self.layout)


_READ_POINTERS = ("cos_ptr", "sin_ptr", "position_ids_ptr", "cu_seqlens_ptr")


class _RotationThroughCopies:
    """A signature whose outputs the kernels cannot store into (ops._launch then rotates into
    fresh tensors and copies): ops.rotate_into at every call."""
    __slots__ = ("layout", "interleaved", "backward")

    def __init__(self, layout, interleaved, backward):
        self.layout, self.interleaved, self.backward = layout, interleaved, backward

    def __call__(self, q, q_out, k, k_out, table, sin, position_ids, cu_seqlens) -> None:
        ops.rotate_into(q, q_out, k, k_out, table, sin, position_ids, cu_seqlens, self.layout,
                        self.interleaved, self.backward)


class _RotationInto:
    """ops.rotate_into planned for one signature: the PlannedRotation (planned as ops._launch
    plans, rows_kept=False) and which of (table, sin, position_ids, cu_seqlens) it reads."""
    __slots__ = ("rotation", "_reads")

    def __init__(self, q, q_out, k, k_out, table, sin, position_ids, cu_seqlens, layout,
                 interleaved, backward):
        slots = [j for j, t in enumerate((table, sin, position_ids, cu_seqlens))
                 if t is not None]
        self.rotation = PlannedRotation(
            xs=(q, k), outs=(q_out, k_out), table=Table(table, sin),
            positions=Positions(position_ids, cu_seqlens),
            pointer_sources=[(_READ_POINTERS[j], i, False) for i, j in enumerate(slots)],
            out_dtype=q_out.dtype, in_place=False, backward=backward, interleaved=interleaved,
            layout=layout, rows_kept=False)
        self._reads = operator.itemgetter(*slots) if len(slots) > 1 else \
            (lambda reads, j=slots[0]: (reads[j],))

    def __call__(self, q, q_out, k, k_out, table, sin, position_ids, cu_seqlens) -> None:
        self.rotation.run_into((q, k), (q_out, k_out),
                               self._reads((table, sin, position_ids, cu_seqlens)))


def rotate_into(q: torch.Tensor, q_out: torch.Tensor, k: torch.Tensor, k_out: torch.Tensor,
                table: torch.Tensor, sin: Optional[torch.Tensor],
                position_ids: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                layout: str, interleaved: bool, backward: bool) -> None:
    """ops.rotate_into (q and k into outputs of the caller's: the QKV projection's dY columns),
    planned once per signature (SIGNATURES, under "rotate_into") where the call is plain eager
    (`active`), and started through EagerLaunch: the plan ops._launch makes, so the same bits.
    Otherwise (a tracer, a tensor subclass) ops.rotate_into itself, which plans every call."""
    sig = signature(("rotate_into", layout, interleaved, backward),
                    (q, q_out, k, k_out, table, sin, position_ids, cu_seqlens)) \
        if active() else None
    if sig is None:
        ops.rotate_into(q, q_out, k, k_out, table, sin, position_ids, cu_seqlens, layout,
                        interleaved, backward)
        return
    planned = SIGNATURES.get(sig)
    if planned is None:
        planned = SIGNATURES.put(sig, plan_into(q, q_out, k, k_out, table, sin, position_ids,
                                                cu_seqlens, layout, interleaved, backward))
    planned(q, q_out, k, k_out, table, sin, position_ids, cu_seqlens)


def plan_into(q, q_out, k, k_out, table, sin, position_ids, cu_seqlens, layout, interleaved,
              backward):
    """rotate_into's entry for a signature (called as rotate_into is, less the options): planned
    where ops._launch would launch at once (q not empty, outputs the kernels store into), else
    ops.rotate_into at every call. A caller that knows the signature already keeps it itself
    (the QKV projection's backward: qkv_plan.DyStep)."""
    x4 = ops.view4(q, layout)
    stores = x4.shape[0] and x4.shape[1] and launch_output_row(
        ops.kernel_view(q_out, layout), ops.kernel_view(k_out, layout), layout) is not None
    if not stores:
        return _RotationThroughCopies(layout, interleaved, backward)
    return _RotationInto(q, q_out, k, k_out, table, sin, position_ids, cu_seqlens, layout,
                        interleaved, backward)


class Rotate(torch.autograd.Function):
    """xs -> rotated xs; backward rotates the gradients back (the same route, reversed).

    apply(rotation, reads, *xs): `reads`, the tables and index tensors the kernel reads, come as
    one tuple, not as inputs of their own. They never take a gradient, and autograd does work for
    every tensor input of a Function, both ways (its metadata, its edge, the set of inputs an
    output is checked against, a None gradient to check on the way back): Rotate's
    forward+backward at decode size cost 1.7 to 2.4 us more with the table as an input
    (benchmarks/autograd_node_costs.py, a CPU, the launches removed; benchmarks/NOTES.md). They
    are kept on ctx with their version counters rather than saved for backward (saving costs
    autograd a SavedVariable each way: 0.5 to 0.9 us of a forward+backward at decode size on an
    idle CPU, the launches removed; benchmarks/NOTES.md), and backward checks the counters itself:
    changing one in place before backward raises autograd's error, as a saved tensor would."""

    @staticmethod
    def forward(ctx, rotation: PlannedRotation, reads: tuple, *xs):
        outs = rotation.run(xs, reads)
        ctx.rotation = rotation
        if rotation.whole_grads:
            ctx.outputs = [(o.shape, o.dtype, o.device) for o in outs]
        ctx.reads = reads
        ctx.versions = [t._version for t in reads]
        return outs[0] if len(xs) == 1 else outs

    @staticmethod
    def backward(ctx, *grads):
        reads = ctx.reads
        for t, version in zip(reads, ctx.versions):
            if t._version != version:
                raise RuntimeError(modified_before_backward(t, version))
        rotation = ctx.rotation
        if rotation.whole_grads:
            grads = tuple(torch.zeros(shape, dtype=dtype, device=device) if g is None
                          else g.contiguous() for g, (shape, dtype, device) in
                          zip(grads, ctx.outputs))
        every = True
        for g in grads:     # (a loop: all() would build a generator on every call)
            if g is None:
                every = False
        present = grads if every else tuple(g for g in grads if g is not None)
        if not present:
            return (None,) * (2 + len(grads))
        rev = rotation.reverse(grads)
        if torch.is_grad_enabled():     # create_graph: the backward is itself differentiable
            out = Rotate.apply(rev, reads, *present)
            gx = out if isinstance(out, tuple) else (out,)
        else:
            gx = rev.run(present, reads)
        if not every:
            it = iter(gx)
            gx = tuple(next(it) if g is not None else None for g in grads)
        return (None, None, *gx)


def modified_before_backward(t: torch.Tensor, version: int) -> str:
    """Autograd's message for a saved tensor changed in place before backward, for a table or
    index tensor that Rotate keeps on ctx (see Rotate)."""
    return ("one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{t.type()} {list(t.shape)}] is at version {t._version}; "
            f"expected version {version} instead. It is a table or index tensor that ropelib's "
            "rotation read in the forward and reads again in the backward: change it only after "
            "backward, or pass a copy")


def direct_apply(function: type):
    """The eager route's entry to an autograd.Function without setup_context: autograd's C++
    apply, without the Python wrapper of Function.apply, which binds default arguments for a
    setup_context and unwraps functorch's dead wrappers (the eager route runs only where no
    transform is active: `active`). For Rotate: 3.9 us a forward with grad against 5.2 through
    Rotate.apply, on a CPU with the launch removed (benchmarks/NOTES.md); the backward is the
    same either way."""
    return super(torch.autograd.Function, function).apply


rotate = direct_apply(Rotate)
