"""What one thread of the naive kernel runs, read from its sm_90 machine code (notebook 03, 4.5).

Notebook 03 compiles `_rope_naive_kernel` for sm_90 at 1 and 2 warps (`offline_compile`, no GPU
needed) and counts, in the SASS cuobjdump prints, the instructions one thread runs when every
angle is below libdevice's long-reduction threshold (105,615 rad, the case of every position the
course times): `fast_path` walks the code from its first instruction and, in each region the
compiler opens with `BSSY` around a sine's or cosine's slow path, takes the region's first
conditional branch, the one that skips the slow path. `by_kind` sorts the instructions into a
few kinds; times the warps, they are what a program executes, set beside the profile's count.
"""
import collections
import re
from typing import Dict, List, Tuple

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
    BSSY region's rest (the sine's and cosine's long argument reduction) is taken. Raises
    ValueError where the code has a branch outside such a region or a region without one."""
    code = instructions(sass)
    at = {addr: i for i, (addr, _, _) in enumerate(code)}
    run, i = [], 0
    while i < len(code):
        _, guarded, body = code[i]
        op = body.split()[0].split(".")[0]
        run.append(body)
        if op == "EXIT":
            return run
        if op == "BRA":
            raise ValueError(f"a branch outside a BSSY region: {body}")
        if op == "BSSY":
            j = i + 1
            while j < len(code) and not (code[j][1] and code[j][2].startswith("BRA")):
                run.append(code[j][2])
                j += 1
            if j == len(code):
                raise ValueError("a BSSY region without a conditional branch")
            run.append(code[j][2])
            i = at[int(code[j][2].split()[1], 16)]       # the branch taken: to the region's end
            continue
        i += 1
    raise ValueError("no EXIT on the path")


def kind_of(body: str) -> str:
    """The kind (a key of KINDS, else "other") of one instruction."""
    op = body.split()[0].split(".")[0]
    return next((k for k, ops in KINDS.items() if op in ops), "other")


def by_kind(run: List[str]) -> Dict[str, int]:
    """How many of `run`'s instructions are of each kind, KINDS' order, "other" last."""
    counted = collections.Counter(kind_of(b) for b in run)
    return {k: counted.get(k, 0) for k in (*KINDS, "other")}
