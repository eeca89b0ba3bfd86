"""Notebook 05, Exercise 1: the worked interleaved kernel beside ropelib's finished kernel on the
same interleaved pairs, both compiled for sm_90 on this machine (no GPU): where in the machine
code the two differ."""
import torch
import triton

from ropelib.course import counts, ladder, load_schedule
from ropelib.course.load_schedule import access_bytes, is_load, is_store
from ropelib.kernels import launch as _launch


def batch_loop(sass: list) -> dict:
    """Split a one-pass kernel's machine code at its batch loop, the last 16-byte load of x
    before the first global store: {"before": instructions before it, "loop": from it to that
    store, both included, "after": the rest}. A kernel with no store, or no 16-byte load before
    it, has no such loop: ValueError."""
    store = next((i for i, s in enumerate(sass) if is_store(s)), None)
    if store is None:
        raise ValueError("no global store in this machine code")
    wide = [i for i, s in enumerate(sass[:store]) if is_load(s) and access_bytes(s) == 16]
    if not wide:
        raise ValueError("no 16-byte load before the first store")
    return dict(before=wide[-1], loop=store - wide[-1] + 1, after=len(sass) - store - 1)


def finished_launch(shape, knobs=None, sm_count: int = 132):
    """ropelib's finished kernel for bf16 sbhd x of `shape` with interleaved pairs and angles
    [S, D], as `apply_rope` launches it on a GPU with `sm_count` SMs and the tile `knobs`
    (ropelib's defaults, the H100's, where None): (kernel, arguments by name, warps)."""
    S, B, H, D = shape
    x = torch.empty(shape, dtype=torch.bfloat16)     # only shapes, strides and dtypes matter
    y, f = torch.empty_like(x), torch.empty(S, D)
    tiles = _launch.pick_tiles(S, B, (H, 0), D, D, x.element_size(), sm_count, **(knobs or {}))
    lau, ptrs = _launch.plan(_launch.View.of(x), _launch.View.of(y), _launch.Table(f, None),
                             _launch.Positions(), R=D, interleaved=True, backward=False,
                             layout="sbhd", tiles=tiles)
    return lau.launcher.kernel, dict(zip(lau.launcher.pointer_names, ptrs), **lau.args), \
        lau.num_warps


def solution_launch(kernel, shape, knobs=None, sm_count: int = 132):
    """Exercise 1's kernel for the same x, on the launch the notebook's timing cell gives it
    (rung 4's plan): (kernel, arguments by name, warps)."""
    S, B, H, D = shape
    x = torch.empty(shape, dtype=torch.bfloat16)
    p = ladder.plan("chunks", S, B, H, D, x.element_size(), sm_count, knobs or {})
    names = [f"stride_{t}{k}" for t in "xy" for k in "sbhd"]
    args = dict(x_ptr=x, y_ptr=torch.empty_like(x), freqs_ptr=torch.empty(S, D), S=S, B=B, H=H,
                B_CHUNK=p.chunk, **dict(zip(names, 2 * x.stride())), HALF=D // 2,
                BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_S=p.block_s, BLOCK_H=p.block_h)
    return kernel, args, p.num_warps


def programs_per_sm(registers: int, threads: int) -> int:
    """Programs of `threads` threads an sm_90 SM holds by registers, threads and its program
    limit alone (no shared memory): counts.programs_per_sm's count."""
    return counts.programs_per_sm(registers, threads // 32, 0).programs


def side_by_side(solution_kernel, shape=(4096, 8, 32, 128), knobs=None,
                 sm_count: int = 132) -> dict:
    """Compile the worked solution and the finished kernel (interleaved) for sm_90 with the tile
    `knobs` of a GPU of `sm_count` SMs and print, for each, its warps, registers, the programs an
    SM holds, loads and stores by width and its machine code split at the batch loop
    (`batch_loop`). Returns {name: (schedule, split, warps, programs an SM)}."""
    out = {}
    print(f"sm_90, Triton {triton.__version__}, bf16 sbhd {list(shape)}, interleaved pairs: "
          "machine code (instructions) before the batch loop / in it (x load to store)")
    for name, (kernel, args, warps) in (
            ("worked solution", solution_launch(solution_kernel, shape, knobs, sm_count)),
            ("ropelib's finished kernel", finished_launch(shape, knobs, sm_count))):
        sc = load_schedule.schedule(kernel, args, num_warps=warps)
        split = batch_loop(sc["sass"])
        k = programs_per_sm(sc["registers"], 32 * warps)
        out[name] = (sc, split, warps, k)
        print(f"  {name:26s} {warps} warps, {sc['registers']} registers ({k} programs an SM); "
              "loads "
              + ", ".join(f"{n} of {b} B" for b, n in load_schedule.load_widths(sc).items())
              + "; stores "
              + ", ".join(f"{n} of {b} B" for b, n in load_schedule.store_widths(sc).items())
              + f"; {split['before']} before the loop / {split['loop']} in it")
    return out
