"""Where a kernel's machine code issues its global loads (notebook 05), with no GPU.

A memory-bound kernel is fast when each thread has its loads in flight together: issued one
after another, before the arithmetic that waits for them. Whether they are is the assembler's
(ptxas's) choice, made when it allocates registers: a load whose destination registers still
hold a value in use must wait until that value is consumed, that is until an earlier load has
landed, a second trip to memory. The PTX does not show it (its registers are virtual); the
SASS, the machine code, does. `schedule(kernel, args, num_warps=...)` compiles a @triton.jit
kernel for sm_90 on this machine (offline_compile: Triton's compiler and ptxas run on the CPU),
disassembles it with cuobjdump, and returns, in machine-code order:

    loads         [(index, instruction)] of every global load (LDG)
    first_math    the index of the first floating-point multiply or fma (FMUL, FFMA)
    early         how many loads come before it
    registers     per thread (ptxas's allocation)
    instructions  of the machine code, in all (the code, not what runs: every branch counts)
    local_stores, local_loads  STL and LDL: registers spilled to local memory, and read back
    sass          the machine code itself, one instruction a line
    ttgir         Triton's GPU IR, the text (its #ttg.blocked layouts say which thread holds what)
    shared        bytes of shared memory a program asks for
    layout_conversions  how many times the TTGIR moves a tensor between register layouts
                  (ttg.convert_layout; a conversion goes through shared memory or shuffles)
    converted_bytes     the bytes of those tensors, a program's whole tensor each time
    dots          matrix multiplies in the TTGIR (tt.dot, or Hopper's warp_group_dot): in a
                  loop's body, the ones each step issues

`load_widths(schedule)` counts those loads by the bytes each moves (LDG.E.128: 16, a lone
bf16: 2), and `check_wide_loads` grades a kernel exercise on them once its own check has
passed: a kernel that computes the right thing with 2-byte loads is correct, not fast.

Under Triton's interpreter (TRITON_INTERPRET=1) the kernel is compiled in a second Python
without it (offline_compile.compiled_code): a kernel of an importable module (ropelib's own) is
imported there by name; one defined in a notebook, from its source, so it must be
self-contained (only `triton`, `triton.language as tl` and its arguments). Pointer arguments are
given as tensors (only their dtype and alignment matter), the others as values, as a launch
would pass them.
"""
import re
from typing import Optional

from .offline_compile import compiled_code, cuobjdump

__all__ = ["schedule", "sass_instructions", "is_load", "is_store", "access_bytes",
           "load_widths", "store_widths", "check_wide_loads"]

_GUARD = r"^(?:@!?U?P\w+\s+)?"                   # an instruction's guard predicate, if any
_MATH = re.compile(_GUARD + r"(FFMA|FMUL)\b")
_LOAD = re.compile(_GUARD + r"LDG\b")
_STORE = re.compile(_GUARD + r"STG\b")
_SPILL_STORE = re.compile(_GUARD + r"STL\b")   # registers spilled to local memory
_SPILL_LOAD = re.compile(_GUARD + r"LDL\b")    # ... and read back


def is_load(instruction: str) -> bool:
    """Whether one SASS instruction (predicate kept) is a global load (LDG)."""
    return bool(_LOAD.match(instruction))


def is_store(instruction: str) -> bool:
    """Whether one SASS instruction (predicate kept) is a global store (STG)."""
    return bool(_STORE.match(instruction))


def sass_instructions(cubin: bytes) -> list:
    """The machine code of a cubin, one instruction a line, predicates kept, in order."""
    text = cuobjdump(cubin, "-sass", timeout=120.0)
    if text is None:
        raise RuntimeError("no cuobjdump: Triton's NVIDIA backend ships one; is it installed?")
    return _instructions(text)


def _instructions(sass: str) -> list:
    """cuobjdump's SASS listing, one instruction a line, predicates kept, in order."""
    return [re.sub(r"^\s+/\*[0-9a-f]+\*/\s+", "", line).split(";")[0].strip()
            for line in sass.splitlines() if re.match(r"^\s+/\*[0-9a-f]{4,}\*/", line)]


def schedule(kernel, args: dict, *, num_warps: int, num_stages: Optional[int] = None,
             timeout: float = 300.0) -> dict:
    """Compile `kernel` for sm_90 as a launch with `args` (every argument by name), `num_warps`
    and `num_stages` (Triton's default where None) would compile it, and say where its machine
    code issues its global loads (see the module docstring)."""
    code = compiled_code(kernel, args, num_warps=num_warps, num_stages=num_stages,
                         timeout=timeout)
    if not code["sass"]:
        raise RuntimeError("no cuobjdump: Triton's NVIDIA backend ships one; is it installed?")
    ins = _instructions(code["sass"])
    loads = [(i, s) for i, s in enumerate(ins) if _LOAD.match(s)]
    first_math = next((i for i, s in enumerate(ins) if _MATH.match(s)), len(ins))
    moved = _conversions(code["ttgir"])
    # shared memory a program asks for (Triton's pipelining buffers and layout conversions),
    # and how many times the TTGIR moves a tensor from one register layout to another
    return dict(loads=loads, first_math=first_math,
                early=sum(i < first_math for i, _ in loads),
                registers=code["resources"].get("registers"), instructions=len(ins),
                local_stores=sum(bool(_SPILL_STORE.match(s)) for s in ins),
                local_loads=sum(bool(_SPILL_LOAD.match(s)) for s in ins),
                sass=ins, ttgir=code["ttgir"], shared=code["shared"],
                dots=len(re.findall(r"= (?:ttng\.warp_group_dot|tt\.dot) ", code["ttgir"])),
                layout_conversions=len(moved), converted_bytes=sum(moved))


_CONVERT = re.compile(r"ttg\.convert_layout .*: tensor<([0-9x]+)x(bf16|f16|f32|f64|i1|i8|i16|i32|i64)")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


def _conversions(ttgir: str) -> list:
    """The bytes of each tensor a TTGIR moves from one register layout to another
    (ttg.convert_layout), a program's whole tensor each time."""
    sizes = []
    for m in _CONVERT.finditer(ttgir):
        n = 1
        for dim in m[1].split("x"):
            n *= int(dim)
        sizes.append(n * _BYTES[m[2]])
    return sizes


# --- the widths of the loads: what a thread moves in one instruction -----------------------------

_WIDTH = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def access_bytes(instruction: str) -> int:
    """The bytes one thread moves with one global load or store of the SASS: LDG.E.128 (or
    STG.E.128) 16, .64 8, .U16 (or .S16, STG.E.U16) 2, .U8 (.S8) 1, and 4 for a plain LDG.E or
    STG.E (one 32-bit word)."""
    mods = re.search(r"(?:LDG|STG)((?:\.\w+)*)", instruction)[1].split(".")
    return next((_WIDTH[m] for m in mods if m in _WIDTH), 4)


def _by_width(instructions) -> dict:
    """{bytes: how many} of global loads or stores, widest first (widths: `access_bytes`)."""
    widths = {}
    for ins in instructions:
        n = access_bytes(ins)
        widths[n] = widths.get(n, 0) + 1
    return dict(sorted(widths.items(), reverse=True))


def load_widths(sched: dict) -> dict:
    """{bytes: how many loads} of a schedule's global loads, widest first."""
    return _by_width(ins for _, ins in sched["loads"])


def store_widths(sched: dict) -> dict:
    """{bytes: how many stores} of a schedule's global stores (STG in its machine code), widest
    first, as `load_widths` counts its loads."""
    return _by_width(ins for ins in sched["sass"] if _STORE.match(ins))


def compiled_for_grading(name: str, kernel, args: dict, *, num_warps: int) -> Optional[dict]:
    """`schedule(kernel, args, num_warps=...)` for an exercise's grade, or None after printing
    the compile error as the exercise `name`'s ❌ (a compile error is the learner's to read)."""
    try:
        return schedule(kernel, args, num_warps=num_warps)
    except Exception as exc:  # noqa: BLE001 -- a compile error is the learner's to read
        print(f"❌ {name}: compiling it for sm_90 failed ({type(exc).__name__}: "
              f"{str(exc)[-600:]})")
        return None


def check_wide_loads(name: str, kernel, args: dict, *, num_warps: int, wide: int,
                     check) -> bool:
    """Grade a kernel exercise on how it loads, after what it computes.

    `check(kernel)` is the exercise's own check of the output (it prints its ✅ or ❌, and bars
    ropelib's answers); only a kernel that passes it is compiled: for sm_90, with `args` and
    `num_warps` as a launch would, and its global loads are counted by width (load_widths). ✅
    when no load moves 2 bytes (a lone bf16 or fp16 element) and at least `wide` move 16 bytes
    (the widest vector there is). Prints one line and returns the verdict; never raises."""
    if not check(kernel):
        print(f"❌ {name}: the kernel must compute RoPE first (the check above); its loads are "
              "counted after that")
        return False
    sched = compiled_for_grading(name, kernel, args, num_warps=num_warps)
    if sched is None:
        return False
    widths = load_widths(sched)
    found = ", ".join(f"{n} of {b} byte{'s' if b > 1 else ''}" for b, n in widths.items())
    if widths.get(2, 0) or widths.get(16, 0) < wide:
        print(f"❌ {name}: a thread's global loads, sm_90: {found}. Wanted: no 2-byte loads and "
              f"at least {wide} of 16 bytes: a run of 8 contiguous 16-bit elements per thread, "
              "which Triton must be able to prove contiguous")
        return False
    print(f"✅ {name}: a thread's global loads, sm_90: {found}")
    return True
