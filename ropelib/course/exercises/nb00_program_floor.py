"""Notebook 00, exercise 2: a kernel's program floor, from a run of programs that do nothing.

A kernel of `empty_programs` programs that do nothing took `empty_us` µs on a GPU of `sms` SMs:
each program cost its SM `empty_us * sms / empty_programs` of time. A kernel of `programs`
programs on that GPU needs at least `programs / sms` of those costs, its *program floor*.

`check_program_floor` tries the learner's function on the five rows of notebook 00's section 4
(the committed Nsight Compute table's program counts, with the committed do_bench run of empty
programs of the same number of warps, `program_cost-nvidia-h200.csv`) and on two GPUs drawn
when it runs (their seed in the label), so a table of answers made beforehand fails. Barred:
ropelib (`own_code`'s default), the course's reader of the committed results
(`ropelib.course.measured`, whose derived rows carry a ns-per-program column), notebooks 03
and 04's worked predictions (which take the cost of a program as given) and the worked
solution. Once the answer passes, the check prints each row's floor against its time.
"""
import inspect
from typing import Callable

import torch

from .own_code import check_cases, fresh_generator

__all__ = ["check_program_floor", "solution_program_floor_us", "ROWS"]

# section 4's rows: the mechanism CSV's variant -> the name the notebook gives it
ROWS = {"copy": "copy", "naive": "03 naive", "batch_reuse": "04 batch-reusing grid",
        "ropelib": "05 finished kernel", "ropelib_planned": "05 two-pass, flat pass"}


def _floor_us(programs, sms, empty_programs, empty_us):
    """The expected answer: programs / sms programs in turn on each SM, each costing what an
    empty program cost its SM (empty_us * sms / empty_programs)."""
    ns_per_program = empty_us * 1e3 * sms / empty_programs
    return programs / sms * ns_per_program / 1e3


def committed_rows() -> list:
    """[(name, args, Nsight Compute µs)] of section 4's five rows, args as the exercise's
    function takes them, from the committed H200 CSVs; [] where they are not in this checkout."""
    from .. import measured
    if not (measured.path("mechanism").is_file() and measured.path("program_cost").is_file()):
        return []
    mech = measured.mechanism()
    empty = {r["num_warps"]: r for r in measured.load("program_cost")[1] if r["kernel"] == "empty"}
    out = []
    for variant, name in ROWS.items():
        r = mech[variant]
        e = empty[r["num_warps"]]
        out.append((name, (r["programs"], r["sm_count"], e["programs"], e["us"]), r["us"]))
    return out


def check_program_floor(fn: Callable) -> bool:
    """fn(programs, sms, empty_programs, empty_us) -> the program floor in µs of a kernel of
    `programs` programs on a GPU of `sms` SMs, where `empty_programs` programs that do nothing
    took `empty_us` µs."""
    from .. import measured
    from .kernels import solution_grid_us
    from .naive_kernel import solution_predicted_us

    rows = committed_rows()
    cases = [(f"section 4's {name}: {args[0]:,} programs, {args[1]} SMs, {args[2]:,} empty "
              f"programs in {args[3]} µs", args, _floor_us(*args)) for name, args, _ in rows]
    seed, g = fresh_generator()     # and GPUs drawn now: a table made beforehand fails

    def drawn(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    for _ in range(2):
        sms, empty_programs = drawn(8, 200), drawn(10_000, 4_000_000)
        empty_us = round(empty_programs / sms * drawn(200, 2_000) / 10 / 1e3, 2)   # 20-200 ns
        args = (drawn(1, 4_000_000), sms, empty_programs, empty_us)
        cases.append((f"{args[0]:,} programs, {sms} SMs, {empty_programs:,} empty programs in "
                      f"{empty_us} µs (drawn with seed {seed})", args, _floor_us(*args)))
    own_readers = tuple(v for v in vars(measured).values()
                        if inspect.isfunction(v) and v.__module__ == measured.__name__)
    ok = check_cases("program floor", "your own program floor", fn, cases, rtol=1e-6, atol=1e-9,
                     hint="an empty program costs its SM empty_us * sms / empty_programs; each "
                          "SM runs programs / sms of them in turn",
                     bar=(*own_readers, committed_rows, solution_program_floor_us,
                          solution_grid_us, solution_predicted_us))
    if ok and rows:                 # the exercise's question, answered from the learner's floors
        print("   section 4's rows (Nsight Compute µs; floors from do_bench's empty programs):")
        for name, args, us in rows:
            floor = _floor_us(*args)
            print(f"   {name:24s} {args[0]:>9,} programs  floor {floor:6.1f} µs  "
                  f"time {us:6.1f} µs  {floor / us:4.0%} of it")
        near = [name for name, args, us in rows if _floor_us(*args) > 0.9 * us]
        print(f"   a floor within 10 % of the time: {', '.join(near) or 'none'}")
    return ok


def solution_program_floor_us(programs, sms, empty_programs, empty_us):
    ns_per_program = empty_us * 1e3 * sms / empty_programs   # one empty program, to its SM
    return programs / sms * ns_per_program / 1e3              # each SM runs its share in turn
