"""Notebook 04, section 2.3 and exercise 6: in what order a kernel's sm_90 machine code issues
its global loads and stores, with no GPU.

Section 2.3 asks whether the batch loop lets a warp ask for the next row of `x` before it stores
the current one; exercise 6's kernel is written so that it does. Both read the answer from the
SASS (the machine code) that `offline_compile.compiled_code` gets from Triton's compiler and
ptxas on the CPU, read instruction by instruction as `load_schedule` reads it:

    accesses(sass)         [("LDG" or "STG", bytes a thread moves)], in machine-code order:
                           every global load and store but the ones tagged .CONSTANT (the
                           tables libdevice's sine and cosine read)
    order(sass)            the same as a string, "L" a load and "S" a store
    runs(seq)              that string in runs, "LL SS LL SS", for printing
    max_bytes_before_store(accesses, width)
                           the most bytes of loads `width` bytes wide a thread issues between
                           two stores: what it has asked for of `x` before it must wait to store
    load_order(kernel, args, num_warps=..., x_bytes_per_thread=...)
                           compiles and returns {"triton", "seq", "rows", "in_flight"}: rows =
                           how many times two stores follow each other (a row's two halves),
                           in_flight = the bytes of x a whole warp (32 threads) has asked for
                           before its next store, at most
"""
import re
from typing import List, Tuple

from .load_schedule import _instructions, access_bytes, is_load, is_store
from .offline_compile import compiled_code

__all__ = ["accesses", "order", "runs", "max_bytes_before_store", "load_order"]


def accesses(sass: str) -> List[Tuple[str, int]]:
    """[(op, bytes a thread moves)] of the global loads (LDG) and stores (STG) of `sass`, in
    order, leaving out loads tagged .CONSTANT (the tables libdevice's sine and cosine read, not
    x or y); the widths are `load_schedule.access_bytes`'s."""
    return [("LDG" if is_load(ins) else "STG", access_bytes(ins))
            for ins in _instructions(sass)
            if is_store(ins) or (is_load(ins) and ".CONSTANT" not in ins)]


def order(sass: str) -> str:
    """The global loads and stores of `sass` in order: "L" a load, "S" a store."""
    return "".join("L" if op == "LDG" else "S" for op, _ in accesses(sass))


def runs(seq: str) -> str:
    """An order string in runs of loads and stores: "LLLLSS" -> "LLLL SS"."""
    return " ".join(re.findall("L+|S+", seq))


def max_bytes_before_store(ops: List[Tuple[str, int]], width: int) -> int:
    """The most bytes of loads exactly `width` bytes wide issued between two stores (or before
    the first), per thread: loads of another width (the angles) are not counted."""
    most = run = 0
    for op, nbytes in ops:
        run = 0 if op == "STG" else run + (nbytes if nbytes == width else 0)
        most = max(most, run)
    return most


def load_order(kernel, args: dict, *, num_warps: int, x_bytes_per_thread: int) -> dict:
    """`kernel` compiled for sm_90 as a launch with `args` would compile it (offline_compile):
    {"triton": the compiler's version, "seq": order(), "rows": the pairs of stores one after
    the other, "in_flight": bytes of x a warp has asked for before its next store, at most},
    x's loads being those `x_bytes_per_thread` wide. Raises RuntimeError without cuobjdump."""
    code = compiled_code(kernel, args, num_warps=num_warps)
    if not code["sass"]:
        raise RuntimeError("reading the SASS needs cuobjdump (Triton ships one)")
    ops = accesses(code["sass"])
    seq = order(code["sass"])
    return dict(triton=code["triton"], seq=seq, rows=seq.count("SS"),
                in_flight=32 * max_bytes_before_store(ops, x_bytes_per_thread))
