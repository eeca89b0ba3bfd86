"""What one thread of the naive kernel runs, read from its sm_90 machine code (notebook 03, 4.5).

Notebook 03 compiles `_rope_naive_kernel` for sm_90 at 1 and 2 warps (`offline_compile`, no GPU
needed) and counts, in the SASS cuobjdump prints, the instructions one thread runs when every
angle is below libdevice's long-reduction threshold (105,615 rad, the case of every position the
course times): `fast_path` reads the code from its first instruction to EXIT, less what a
thread skips in each region the compiler opens with `BSSY` around a sine's or cosine's slow path
(`counts.slow_path`: from the region's first conditional branch to its target). `by_kind` sorts
the instructions into a few kinds; times the warps, they are what a program executes, set
beside the profile's count.
"""
import collections
import re
from typing import Dict, List, Tuple

from . import counts

__all__ = ["KINDS", "instructions", "fast_path", "kind_of", "by_kind"]

# opcode (before the first dot) -> kind
KINDS = {
    "float": {"FFMA", "FMUL", "FADD", "FSETP", "FSEL", "FMNMX"},      # the angles and the rotation
    "integer": {"IMAD", "IADD3", "VIADD", "LEA", "LOP3", "SHF", "ISETP", "IABS", "MOV", "PRMT",
                "SEL", "IMNMX"},                                    # indices, addresses, moves
    "memory": {"LDG", "STG"},                                       # global loads and stores
    "conversion": {"F2I", "I2F", "I2FP", "F2FP", "F2F"},
    "branch": {"BRA", "BSSY", "BSYNC", "EXIT"},
}


def instructions(sass: str) -> List[Tuple[int, bool, str]]:
    """(address, predicated, instruction without its predicate) for each line of cuobjdump's
    SASS."""
    out = []
    for m in re.finditer(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass, re.M):
        text = m[2].strip()
        guard = re.match(r"@!?U?P\w+\s+", text)
        out.append((int(m[1], 16), guard is not None, text[guard.end():] if guard else text))
    return out


def fast_path(sass: str) -> List[str]:
    """The instructions one thread runs, in order, up to EXIT, when every branch that skips a
    BSSY region's rest (the sine's and cosine's long argument reduction) is taken: the code in
    address order less `counts.slow_path`. Raises ValueError where the path meets another branch
    (a loop, or a branch outside such a region) or no EXIT."""
    skipped = counts.slow_path(sass)
    taken = counts.slow_path_branches(sass)
    run = []
    for addr, _, body in instructions(sass):
        if addr in skipped:
            continue
        op = body.split()[0].split(".")[0]
        run.append(body)
        if op == "EXIT":
            return run
        if op == "BRA" and addr not in taken:
            raise ValueError(f"a branch outside a BSSY region: {body}")
    raise ValueError("no EXIT on the path")


def kind_of(body: str) -> str:
    """The kind (a key of KINDS, else "other") of one instruction."""
    op = body.split()[0].split(".")[0]
    return next((k for k, ops in KINDS.items() if op in ops), "other")


def by_kind(run: List[str]) -> Dict[str, int]:
    """How many of `run`'s instructions are of each kind, KINDS' order, "other" last."""
    counted = collections.Counter(kind_of(b) for b in run)
    return {k: counted.get(k, 0) for k in (*KINDS, "other")}
