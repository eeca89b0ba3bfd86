"""Notebook 04, section 5.3: every variant of the ablation kernel, launched through the
notebook's own launcher, checked against the fp64 reference and, bit for bit, against the
course's kernel (``ablation.rope_ablation``); on a GPU, section 5.3's question timed live first.

    assert_variants_match_fp64_and_course(launch, x, freqs2d, gpu=...)
        the whole check: prints one row per variant (grid, head ulps from fp64, same bits as
        the course's kernel); on a GPU times sh_one_b against sh_loop_b, with sin/cos and with
        tables, and the learner's sh_loop_b beside the course's, and asserts that the programs,
        not the sin/cos, make the ratio; last asserts every variant is RoPE and the course's bits
    same_launch(variants, warps_matter)
        {variant: the first variant with the same launch} (the interpreter ignores num_warps)
    granularity_ratios(us, rounds) / check_granularity(ratios)
        the live ratios the GPU branch prints, and the claim it asserts on them

The checks come after the timings, so that a kernel edited on purpose is still timed; they then
stop the notebook (AssertionError) with the names of the variants that fail.
``tests/test_nb04_variants.py`` runs them on the CPU, with a fake timer for the GPU branch.
"""
from typing import Callable, Dict, Optional

import torch

from ropelib import reference
from ropelib.bench import compare

from . import nb04_timing
from .kernels import ablation

# section 5.3's question: one row a program against B, with sin/cos and with tables
GRANULARITY = ("sh_loop_b", "sh_one_b", "sh_loop_b_table", "sh_one_b_table")
YOURS = "sh_loop_b, yours"   # the learner's launcher with sh_loop_b's options, timed beside them
TIMED = GRANULARITY + (YOURS,)   # the launches alternate in this order in each round
MAX_HEAD_ULP = 1.0   # a variant further than this from the fp64 reference is no longer RoPE


def same_launch(variants: Dict[str, dict], warps_matter: bool) -> Dict[str, str]:
    """{variant: the first variant whose launch is the same}: each variant itself unless
    ``warps_matter`` is False (the interpreter, which ignores num_warps) and an earlier variant
    differs from it only in num_warps."""
    first, out = {}, {}
    for name, opts in variants.items():
        launch = tuple(sorted((k, v) for k, v in opts.items() if warps_matter or k != "num_warps"))
        out[name] = first.setdefault(launch, name)
    return out


def granularity_ratios(us: Dict[str, float], rounds: Dict[str, list]) -> dict:
    """The live ratios of section 5.3 from do_bench medians ``us`` and each round's µs
    ``rounds`` (``nb04_timing.alternating_medians``): one row a program instead of B, with
    sin/cos (``one_row``) and with tables (``one_row_table``); sin/cos instead of tables at B
    rows and at one row a program (``trig``); sh_one_b / sh_loop_b in each round
    (``per_round``)."""
    return dict(
        one_row=us["sh_one_b"] / us["sh_loop_b"],
        one_row_table=us["sh_one_b_table"] / us["sh_loop_b_table"],
        trig={k: us[k] / us[k + "_table"] for k in ("sh_loop_b", "sh_one_b")},
        per_round=[o / l_ for o, l_ in zip(rounds["sh_one_b"], rounds["sh_loop_b"])])


def check_granularity(ratios: dict) -> None:
    """The programs, not the sin/cos: the ratio stays (above 0.8 of itself) when no kernel
    evaluates a sine, and sin/cos cost under 10 % at one row a program."""
    assert ratios["one_row_table"] > 0.8 * ratios["one_row"] \
        and abs(ratios["trig"]["sh_one_b"] - 1) < 0.1, (
        f"sh_one_b / sh_loop_b is {ratios['one_row']:.2f} with sin/cos but "
        f"{ratios['one_row_table']:.2f} with tables, and sin/cos instead of tables costs "
        f"{ratios['trig']['sh_one_b']:.3f}x at one row a program: not the programs alone")


def assert_variants_match_fp64_and_course(
        launch: Callable[..., torch.Tensor], x: torch.Tensor, freqs2d: torch.Tensor, *,
        gpu: bool, timer: Optional[Callable[[Callable], float]] = None, rounds: int = 3) -> dict:
    """Check every variant of ``ablation.variants(H)`` launched by ``launch``.

    Args:
        launch: the notebook's launcher, ``launch(x, freqs2d, cos2d, sin2d, out=None, **opts)``
            with ``ablation.rope_ablation``'s keyword options; without ``out`` it returns a new
            tensor (the notebook's starts as NaN, so an element it never writes fails).
        x: [S, B, H, D] sbhd input; freqs2d: fp32 angles [S, D] (cos/sin tables are made here).
        gpu: on a GPU num_warps changes the launch and the GPU branch times; in the interpreter
            variants that differ only in num_warps are launched once, and nothing is timed.
        timer: ``timer(call)`` -> µs for ``nb04_timing.alternating_medians`` (default do_bench).
        rounds: timing rounds.
    Returns:
        {"err": {variant: max head ulps from fp64}, "same": {variant: bits equal to the
        course's}, and on a GPU "us", "rounds" and "ratios" (``granularity_ratios``)}.
    Raises:
        AssertionError: a variant is more than MAX_HEAD_ULP from the fp64 reference, or
            correct but not the bits of ``ablation.rope_ablation``; on a GPU, the ratio of
            section 5.3 is not the programs' (``check_granularity``).
    """
    S, B, H, D = x.shape
    cos2d, sin2d = torch.cos(freqs2d), torch.sin(freqs2d)   # the tables the *_table rows read
    want = reference.rope_reference(x.double(), freqs2d)     # fp64
    variants = {name: opts for name, _, _, opts in ablation.variants(H)}
    first = same_launch(variants, warps_matter=gpu)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[x.dtype]
    print(f"x [S={S}, B={B}, H={H}, D={D}] {dtype} on {x.device}")
    print(f"{'variant':22} {'grid':>10} {'head ulps':>9}  same bits as ablation.rope_ablation")
    err, same = {}, {}
    for name, opts in variants.items():
        if first[name] == name:
            y_mine = launch(x, freqs2d, cos2d, sin2d, **opts)
            y_course = ablation.rope_ablation(x, freqs2d, cos2d, sin2d, **opts)
            err[name] = compare.error_metrics(y_mine, want)["max_head_ulp_err"]
            same[name] = torch.equal(y_mine, y_course)
        else:
            err[name], same[name] = err[first[name]], same[first[name]]
        print(f"{name:22} {ablation.shape_columns(S, B, H, D, opts)['grid']:>10} "
              f"{err[name]:9.2f}  {same[name]}"
              + ("" if first[name] == name else f"  (here the same launch as {first[name]})"))
    out = {"err": err, "same": same}

    # section 5.3's question on this machine, and the learner's sh_loop_b beside the course's:
    # each launch once here, timed on a GPU only
    y_buf = torch.empty_like(x)
    calls = {n: lambda o=variants[n]: ablation.rope_ablation(x, freqs2d, cos2d, sin2d,
                                                             out=y_buf, **o)
             for n in GRANULARITY}
    calls[YOURS] = lambda: launch(x, freqs2d, cos2d, sin2d, out=y_buf, **variants["sh_loop_b"])
    for call in calls.values():
        call()
    if gpu:   # `rounds` rounds, the five launches alternating in each
        us, per_round = nb04_timing.alternating_medians(calls, rounds=rounds, timer=timer)
        ratios = granularity_ratios(us, per_round)
        out.update(us=us, rounds=per_round, ratios=ratios)
        print(f"sh_loop_b: yours {us[YOURS]:.1f} us, the course's {us['sh_loop_b']:.1f} us")
        print(f"medians of {rounds} alternating rounds; sh_one_b / sh_loop_b by round: "
              f"{min(ratios['per_round']):.2f} to {max(ratios['per_round']):.2f}")
        print(f"live: one row a program instead of B: {ratios['one_row']:.2f}x the time with "
              f"sin/cos, {ratios['one_row_table']:.2f}x with tables; sin/cos instead of tables: "
              f"{ratios['trig']['sh_loop_b']:.3f}x at B rows a program, "
              f"{ratios['trig']['sh_one_b']:.3f}x at one")
        check_granularity(ratios)
    else:
        print("The timings need a GPU (the interpreter runs one program after another in "
              "Python): there the cell prints sh_one_b / sh_loop_b with sin/cos and with tables, "
              "and what sin/cos cost at B rows and at one row a program.")

    # last, the checks, after the timings, so that an edit made on purpose is still timed
    wrong = [n for n, e in err.items() if not e <= MAX_HEAD_ULP]
    assert not wrong, f"no longer RoPE (more than 1 head ulp from the fp64 reference): {wrong}"
    differ = [n for n, s in same.items() if not s]
    assert not differ, f"correct, but not the bits of the course's kernel: {differ}"
    return out
