"""Which bytes a Triton kernel touches: a launch's loads and stores, recorded in the interpreter.

A study tool (notebook 03). `record(kernel, grid, *args)` launches `kernel[grid](*args)` in
Triton's CPU interpreter with `tl.load`/`tl.store` wrapped, and returns one `Access` per memory
instruction each program ran: which program, load or store, and the byte address of every lane
the mask left on. `sector_use` turns one access into what a GPU's memory system sees: the
32-byte sectors it touches and how many of their bytes it uses.

The addresses are measured, not computed from the kernel's source: what the interpreter loads
and stores is what the kernel asked for. (Which lanes a GPU groups into one warp instruction
depends on the compiler's layout; a program's tile is the unit recorded here.)
"""
import contextlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple

import numpy as np
import torch

from .work_count import _byte_range, interpreted

SECTOR_BYTES = 32  # the unit an NVIDIA GPU's L1/L2 move: a cache line is 4 sectors of 32 bytes


@dataclass(frozen=True)
class Access:
    """One memory instruction of one program."""
    program: Tuple[int, int, int]  # tl.program_id(0), (1), (2)
    kind: str                      # "load" or "store"
    addresses: np.ndarray          # uint64 byte address of each live lane, in lane order
    itemsize: int                  # bytes per element

    def offsets(self, tensor: torch.Tensor) -> np.ndarray:
        """Byte offsets of the lanes from the start of `tensor`'s data."""
        return self.addresses.astype(np.int64) - np.int64(tensor.data_ptr())

    def within(self, tensor: torch.Tensor) -> bool:
        """True when every lane lies in `tensor`'s storage."""
        start = tensor.untyped_storage().data_ptr()
        end = start + tensor.untyped_storage().nbytes()
        a = self.addresses
        return a.size > 0 and bool(((a >= start) & (a + self.itemsize <= end)).all())




@contextlib.contextmanager
def _recording(log: List[Access]):
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def _add(self, kind, ptrs, mask):
        live = np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)
        log.append(Access(tuple(int(i) for i in self.grid_idx), kind,
                          ptrs.data[live].astype(np.uint64).ravel().copy(),
                          ptrs.get_element_ty().primitive_bitwidth // 8))

    # the builder's other arguments (cache and eviction policies, volatility) differ between
    # Triton releases: pass them through as they come
    def masked_load(self, ptrs, mask, *rest, **kw):
        _add(self, "load", ptrs, mask)
        return load(self, ptrs, mask, *rest, **kw)

    def masked_store(self, ptrs, value, mask, *rest, **kw):
        _add(self, "store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest, **kw)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    try:
        yield log
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


def record(kernel, grid, *args, **kwargs) -> List[Access]:
    """Launch kernel[grid](*args, **kwargs) in the interpreter; return every load and store run.

    Args:
        kernel: a @triton.jit function (run through the interpreter even on a GPU machine).
        grid: the launch grid, a tuple.
        args, kwargs: the kernel's arguments; tensors must be CPU tensors, so that the recorded
            addresses are those of the tensors passed (compare with `tensor.data_ptr()`).
    Returns:
        One Access per executed tl.load / tl.store, in program order (masked-off lanes dropped).
    """
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            raise ValueError("record: pass CPU tensors (the interpreter runs on the CPU), got one "
                             f"on {a.device}")
    log: List[Access] = []
    with _recording(log):
        interpreted(kernel)[grid](*args, **kwargs)
    return log


@contextlib.contextmanager
def recording():
    """`with recording() as log:` records every load and store of the interpreted launches
    inside the block (launch `interpreted(kernel)` on CPU tensors), as `record` does for one."""
    log: List[Access] = []
    with _recording(log):
        yield log


def outside(accesses, tensors, kind: str = "load") -> int:
    """How many lanes of the `kind` accesses lie in none of `tensors`' own elements: a view's
    elements, not the storage around it (a guard band counts as outside). A load whose mask was
    forgotten reads past the end of its tensor; a masked store may drop the values it read, so no
    output shows it, but on a GPU a load past the end of an allocation can fault."""
    spans = []
    for t in tensors:
        if t.numel():
            assert all(s >= 0 for s in t.stride()), "outside: views with negative strides"
            spans.append(_byte_range(t))
    stray = 0
    for a in accesses:
        if a.kind != kind:
            continue
        inside = np.zeros(a.addresses.shape, dtype=bool)
        for lo, hi in spans:
            inside |= (a.addresses >= lo) & (a.addresses + a.itemsize <= hi)
        stray += int((~inside).sum())
    return stray


def sector_use(access: Access, base: int = 0) -> Dict[int, int]:
    """{sector index: bytes of it the access uses}; sectors counted from byte `base`."""
    first = (access.addresses.astype(np.int64) - base) // SECTOR_BYTES
    used: Dict[int, int] = {}
    for sector in first.tolist():  # elements of 1, 2, 4, 8 bytes never straddle a sector
        used[sector] = used.get(sector, 0) + access.itemsize
    return used


def summary(accesses, kind: str) -> Dict[str, float]:
    """Instructions, sectors moved (summed over instructions), distinct sectors and the fraction
    of the moved sector bytes that were used, for the accesses of one kind ("load"/"store")."""
    mine = [a for a in accesses if a.kind == kind]
    moved = used = 0
    distinct = set()
    for a in mine:
        u = sector_use(a)
        moved += len(u)
        used += sum(u.values())
        distinct.update(u)
    return {"instructions": len(mine), "sectors moved": moved, "distinct sectors": len(distinct),
            "bytes used": used, "efficiency": used / (moved * SECTOR_BYTES) if moved else 0.0}


def by_tensor(accesses, tensors: Mapping[str, torch.Tensor]) -> Dict[str, List[Access]]:
    """Group accesses by the named tensor whose storage they lie in (others are left out)."""
    out: Dict[str, List[Access]] = {name: [] for name in tensors}
    for a in accesses:
        for name, t in tensors.items():
            if a.within(t):
                out[name].append(a)
                break
    return out
