"""Notebook 09, appendix A.5: section 9's kernels checked at several ``ROWS``, then timed against
a plain copy of as many bytes.

One launch on the model's $q$ (a strided view) reads and writes $q$'s bytes once; a kernel's
*fraction of a copy* is the time of a plain ``copy_`` of as many bytes over the kernel's.
:func:`time_against_copy` times each launch two ways: by ``do_bench`` (CUDA events around each
launch, after an L2 flush; ``compare.time_ms``) and by the profiler's device time of the same
launches (:func:`~ropelib.course.nb09_device_time.device_ms_or_none`). Events around a short
launch can time the host's pace instead of the kernel's: the share of do_bench's time that is not
device time says how much.

The timers and the launcher are arguments, so the tests run every line on the CPU with fakes.
"""
from __future__ import annotations

import torch

from .nb09_device_time import device_ms_or_none

ROWS = (4, 16, 64)
"""The ``ROWS`` (rows of $q$ a program) each kernel is checked and timed at."""


def _launch(kern, x, freqs_rows, y, rows):
    from .exercises import in_a_model
    return in_a_model.launch_model_rope(kern, x, freqs_rows, y, rows)


def _do_bench_ms(fn, device) -> float:
    from ..bench import compare      # imported late: compare is a heavier module
    return compare.time_ms(fn, device)[0]


def _apply_qk(q, k, freqs):
    import ropelib
    return ropelib.apply_rope_qk(q, k, freqs, layout="bshd")


def same_rotation(kernels: dict, q, freqs_rows, expected, *, rows=ROWS, launch=_launch,
                  out=print) -> dict:
    """{(kernel name, ROWS): whether `kernel` launched at ROWS on q rotates it as `expected` (fp32,
    within 1e-6)}; prints one line of them."""
    ok = {}
    for name, kern in kernels.items():
        for r in rows:
            y = torch.empty_like(q)
            launch(kern, q, freqs_rows, y, r)
            ok[name, r] = torch.allclose(y, expected, rtol=1e-6, atol=1e-6)
    out("the same rotation as ropelib's at ROWS " + ", ".join(map(str, rows))
        + " (fp32, within 1e-6): "
        + "; ".join(f"{name} " + ", ".join(str(ok[name, r]) for r in rows) for name in kernels))
    return ok


def time_against_copy(kernels: dict, rows_ok: dict, q_t, k_t, f_t, device, *, rows=ROWS,
                      launch=_launch, time_ms=_do_bench_ms, device_ms=device_ms_or_none,
                      apply_qk=_apply_qk, out=print, times=None) -> dict:
    """Time each kernel of `kernels` that `rows_ok` passed, at each of `rows`, on `q_t`
    ([B, S, H, D], a strided view) with the table `f_t` ([S, 1, 1, D] fp32), against a plain copy
    of q's bytes; then ropelib's ``apply_rope_qk`` on q and k against two copies. Prints a table.

    Returns {(kernel name, ROWS): (fraction of a copy by do_bench, by device time or None)}.
    `time_ms(fn, device)` gives do_bench's ms of a call, `device_ms(fn, device)` its device time
    or None (a machine whose profiler sees no device time), `launch(kern, x, freqs_rows, y, rows)`
    launches a kernel, `apply_qk(q, k, freqs)` is ropelib's. The table's first line names the
    GPU that timed it (`torch.cuda.get_device_name`; q's device type off a GPU). `times`, a dict
    where given, receives the ms themselves: {"copy": (do_bench, device time or None),
    (kernel name, ROWS): (do_bench, device time or None)}."""
    f_rows = f_t.reshape(q_t.shape[1], -1).contiguous()          # [S, D]: the kernel's table
    y_t = torch.empty(q_t.shape, dtype=q_t.dtype, device=q_t.device)  # contiguous
    packed = q_t.contiguous()                                     # q's bytes, contiguous
    plain_copy = lambda: y_t.copy_(packed)                        # the yardstick
    t_copy, d_copy = time_ms(plain_copy, device), device_ms(plain_copy, device)
    q_mb = 2 * q_t.numel() * q_t.element_size() / 1e6            # read and written
    dtype = str(q_t.dtype).removeprefix("torch.").replace("bfloat16", "bf16")
    where = (torch.cuda.get_device_name(q_t.device) if q_t.device.type == "cuda"
             else q_t.device.type)                                # the table's GPU, by name
    times = {} if times is None else times
    times["copy"] = (t_copy, d_copy)
    out(f"{where}: q {tuple(q_t.shape)} {dtype}, a strided view, {q_mb:.1f} MB read and "
        f"written; a plain copy of as many bytes: do_bench {1e3 * t_copy:.1f} µs"
        + ("" if d_copy is None else f", device time {1e3 * d_copy:.1f} µs"))
    out(f"{'kernel':>18} {'ROWS':>5} {'do_bench µs':>12} {'device µs':>10} "
        f"{'fraction (do_bench)':>20} {'(device)':>9} {'not device':>11}")
    frac = {}               # (kernel, ROWS): (fraction of a copy by do_bench, by device time)
    for name, kern in kernels.items():
        for r in rows:
            if not rows_ok[name, r]:
                out(f"{name:>18} {r:5d} (wrong rotation: not timed)")
                continue
            call = lambda: launch(kern, q_t, f_rows, y_t, r)
            t = time_ms(call, device)
            d = None if d_copy is None else device_ms(call, device)
            times[name, r] = (t, d)
            if d is None:
                frac[name, r] = (t_copy / t, None)
                out(f"{name:>18} {r:5d} {1e3 * t:12.1f} {'-':>10} {t_copy / t:20.2f}")
                continue
            frac[name, r] = (t_copy / t, d_copy / d)
            out(f"{name:>18} {r:5d} {1e3 * t:12.1f} {1e3 * d:10.1f} {t_copy / t:20.2f} "
                f"{d_copy / d:9.2f} {100 * max(0.0, t - d) / t:10.0f}%")
            assert d < 1.5 * t, (name, r, t, d)   # the events span the kernel: no shorter
    t_lib = time_ms(lambda: apply_qk(q_t, k_t, f_t), device)
    out(f"ropelib.apply_rope_qk, q and k in one launch: {1e3 * t_lib:.1f} µs, "
        f"{2 * t_copy / t_lib:.2f} of two plain copies' speed")
    assert all(0.05 < f < 1.5 for f, _ in frac.values()), frac   # sanity bands, not values
    return frac
