"""Every kernel family's tile knobs in one place, each with where it was measured, and the
per-GPU lookup. The planners (`pick_tiles` of kernels/launch.py, qk_norm_rope.py, kv_cache.py,
mrope.py) turn these into a grid for each shape; benchmarks/tiles.py and
benchmarks/feature_tiles.py are the sweeps that chose them (runs in benchmarks/NOTES.md).
"""
from functools import lru_cache

import torch

from ..runtime import INTERPRET

# --- the finished RoPE kernel (kernels/fused.py) --------------------------------------------
# (elements per thread, warps) per program, measured on an H100. 16-bit inputs with a batch loop
# of >= BATCH_LOOP_MIN entries stream best with many threads (8 x 16 warps); without one (thd,
# batch < 4) the cos/sin of a program's tokens is evaluated per thread and not reused, so fewer
# threads with more elements each win: 64 x 4 warps (two tokens of 32 heads x 128) reached 0.946
# of a copy at s16384 b1 bf16 where 32 x 4 (one token) reached 0.868, and a precomputed cos/sin
# table 0.953 (benchmarks/compile_gap.py, results/compile_gap-nvidia-h100-80gb-hbm3.log).
TILE_LOOP = (8, 16)       # 16-bit, batch loop of >= 4 entries
TILE_NOLOOP = (64, 4)     # 16-bit, shorter batch loop
TILE_WIDE = (16, 8)       # 32- and 64-bit
BATCH_LOOP_MIN = 4
MIN_TILE = 512            # elements: the smallest tile an underfilled grid is split into
PROGRAMS_PER_SM = 4       # fewer programs than this per SM: split the batch, then shrink tiles
# GPUs whose best tiles differ from the H100's, by torch.cuda.get_device_name().
TILES_BY_GPU: dict = {
    # 1 GiB bf16 with a batch loop: 0.946 of copy with (16, 8) against 0.917 with the H100's
    # (8, 16); thd and fp32 keep the H100's (tiles-nvidia-h200-20261122.log)
    "NVIDIA H200": {"loop": (16, 8),
                    # table-free angles (more arithmetic per element) keep more threads: bshd
                    # bf16 0.5345 ms at 1 GiB and 0.1375 ms at 256 MiB with (8, 16), 0.5476 and
                    # 0.1389 with (16, 8) (feature-tiles-exact-nvidia-h200-20261122.log)
                    "exact_loop": (8, 16)},
}

# --- the two-pass route (kernels/flat.py) ---------------------------------------------------
# Large contiguous inputs take the two-pass route: a cos/sin table of the call's tokens, then
# a flat pass of TWO_PASS_ELEMENTS elements and TWO_PASS_WARPS warps per program (interleaved
# pairs; rotate-half pairs: TWO_PASS_PAIR_WARPS, below).
# The flat shape with an fp32 table in L2 reached 0.98-1.00 of a copy on an H100 and an H200
# where the finished kernel reached 0.89-0.97 (benchmarks/flat_probe.py); the table costs a
# launch and S x R x 8 bytes, so smaller inputs keep the finished kernel (one launch).
TWO_PASS_MIN_BYTES = 64 << 20      # of q (and k) read
# ... and only where the fp32 table is small beside the tensor: the flat pass moves at least
# this many times the table's bytes (written and read). At batch 1 with 32 heads of 128 the
# table is 1/8 of them and the route lost when every call wrote its rows (0.82 of a copy
# against 0.89, H200, s16k).
TWO_PASS_TABLE_SHARE = 32
# An eager call keeps the pre-pass's rows between calls (eager.TableRows), so a model's later
# layers only read them: then their reads alone are counted, against this share. At batch 1,
# reading them (1/16 of the bytes moved) the route won: s16k b1 bf16 0.927 forward and 0.947
# forward+backward against the finished kernel's 0.890 and 0.869, s8k b1 0.938 against 0.885
# (H200, results/two_pass-nvidia-h200-20261128-0853.csv, rows kept).
TWO_PASS_KEPT_TABLE_SHARE = 16
TWO_PASS_ELEMENTS = 1024
# ... and in Triton's interpreter, where each program costs ~3 ms whatever its size
TWO_PASS_INTERPRETED_ELEMENTS = 1 << 14
TWO_PASS_WARPS = 4
# Rotate-half pairs are rotated with both members in one thread (x_a and x_b of the same pairs,
# no partner loaded a second time): programs of whole head rows, TWO_PASS_ELEMENTS elements at
# D = 128 (8 rows), on 2 warps, 16 elements a thread. On an H200 (bf16, the fp32 cos and s'
# rows, results/paired_rows_probe-nvidia-h200.csv of 2026-11-29) this reached 0.993 of a copy
# at 1 GiB sbhd, 0.986 at 256 MiB bshd and 0.993 at 256 MiB sbhd, where the element-wise pass
# (a partner load per element) reached 0.948, 0.977 and 0.968 and torch.compile's kernel 0.994,
# 0.985 and 0.991 in the same run; 16 rows on 4 warps 0.988, 0.988, 0.993.
TWO_PASS_PAIR_WARPS = 2
# (token, pair) entries per program of the pre-pass: 2 a thread on its 4 warps. Its programs are
# latency-bound (each entry's sine and cosine, a store); at 64 MiB (s1024 b8, 64 pairs) 256
# spread it over 256 programs instead of 64, and the flat pass after a pre-pass is launched
# early (programmatic dependent launch, compute capability 9.0 and up; kernels/flat.py): its
# launch overlaps the pre-pass instead of following it. Under CUDA graphs on an H200 (bf16,
# forward+backward, of two copies; results/mid_fwdbwd_variants-nvidia-h200-20261201-1444.log):
# 64 MiB sbhd 0.900 -> 0.948 (0.931 with 256 alone, 0.914 early alone), bshd 0.894 -> 0.942,
# thd 0.895 -> 0.945, 256 MiB bshd 0.961 -> 0.975; forward at 64 MiB 0.918 -> 0.948.
TWO_PASS_TABLE_ELEMENTS = 256
# Rotate-half rows after a pre-pass: the pre-pass writes a flag per row (does one of its pairs
# have members whose cos or sin differ?) and member b's entries only where it does; the flat
# pass reads them only there. The tables models pass repeat each frequency in both members, so
# the rows' bytes written and read halve. With one flag for the whole table, zeroed when kept
# rows were made, the kept rows' reads went 0.932 -> 0.963 of a copy at s16k b1 bf16 and
# 0.986 -> 1.002 at 1 GiB (H200, results/half_rows_probe-nvidia-h200-20261202-0822.csv);
# per row, no flag needs zeroing, so calls whose rows are not kept (compiled code, CUDA
# graphs, inference tables) halve theirs too. False: full rows, no flags (for comparisons).
TWO_PASS_ROW_FLAGS = True
# Kept rows (eager.TableRows) whose flags are all 0, found once the flags' reduction has reached
# the host without waiting for it: later calls run a flat pass that loads neither flags nor
# member b's entries (PAIRS_EQUAL), where the rows are read once (one batch entry, no
# KEEP_TABLE). Forward, of a copy, with flags -> without (H200, bf16, five alternating rounds,
# results/half_rows_probe-nvidia-h200-20261202-1747.csv): s16k b1 sbhd 0.942 -> 0.946, bshd
# 0.947 -> 0.957, s32k b1 0.953 -> 0.961; but at 1 GiB b8, rows read from L2, 1.000 -> 0.990
# (every round slower), so batches keep the pass with flags. False: kept rows read their
# flags every call.
TWO_PASS_PAIRS_EQUAL = True
# False: every kernel waits for the one before it to end before it launches (the flat pass after
# its pre-pass, the QKV projection's forward after its cos/sin rows)
EARLY_LAUNCH = True
# Packed sequences (thd) whose positions are each token's index in its sequence: the flat pass
# can take one sequence per grid row, its positions' rows read as sbhd reads a token's (no row
# index per token, no index pass), as flash-attn's Triton rotary does with the longest
# sequence's length. Without that length on the host, the grid covers min(P, T) positions of
# every sequence, and programs past a sequence's end return at once: taken while that grid is
# at most this many times the tokens. Empty programs are not free: on an H200 (bf16, 8 x 4096
# tokens, 32 heads of 128, element-wise flat pass; results/two_pass_thd-nvidia-h200.csv
# of 2026-11-29) a grid of exactly the tokens (a table of 4096 rows) reached 0.879 of a copy
# where the row index reached 0.857, and a grid of twice the tokens (8192 rows) 0.517; three
# uneven sequences on a table of T rows (a grid of 3T) 0.35-0.40. So only a grid of the tokens
# themselves takes it.
TWO_PASS_SEQUENCE_GRID = 1

# --- QK-RMSNorm + RoPE (kernels/qk_norm_rope.py) ---------------------------------------------
# Elements of q (or k) a program moves per batch entry, and per thread. Measured on an H200 with
# benchmarks/feature_tiles.py: one warp on 8 heads of one token was best forward and backward.
QK_NORM_ROWS_PER_STEP = 1024
QK_NORM_ELEMENTS_PER_THREAD = 32
QK_NORM_PROGRAMS_PER_SM = 4      # fewer: split the batch
# The backward's rows (token x head x batch entry) per partial sum of the weights' gradient.
# Where a token block holds fewer than QK_NORM_GROUP_BELOW_ROWS rows, a program takes token
# blocks in turn until it handles QK_NORM_ROWS_PER_PARTIAL (kernels/qk_norm_rope.py,
# pick_token_blocks). Measured on an H200 (bf16, 32/8 heads of 128, forward+backward replayed
# from a CUDA graph, against two copies;
# results/qk_norm_ab-token-groups-nvidia-h200-20261202-0154.log): 8 rows a block, 16 blocks a
# program: b1 s32768 0.493 -> 0.653, 8 packed sequences of 4096 0.485 -> 0.676. With more rows
# a block the loop lost: 64 rows (b8 s4096), 2 blocks a program, 0.708 -> 0.623, the loop
# holding 197 registers a thread against 168 for sm_90 (10 one-warp programs an SM instead of
# 12); 16 rows (b2 s16384), 8 blocks, 0.581 -> 0.592, level (...-20261202-0145.log). Hiding the
# features' offsets from the compiler kept 168 registers but was slower still (0.520 at b8
# s4096).
QK_NORM_ROWS_PER_PARTIAL = 128
QK_NORM_GROUP_BELOW_ROWS = 16

# --- RoPE + KV-cache write (kernels/kv_cache.py) ---------------------------------------------
KV_CACHE_ELEMENTS_PER_STEP = 2048   # of q (or k) per program and batch entry (16 x 128)
KV_CACHE_PROGRAMS_PER_SM = 2        # fewer: split the heads (decode is a few KB per sequence)

# --- multi-axis RoPE (kernels/mrope.py) ------------------------------------------------------
# A loop step moves about MROPE_STEP_ELEMENTS elements (both halves and the pass-through part,
# padded to powers of two) of up to MROPE_HEADS_PER_STEP heads, MROPE_ELEMENTS_PER_THREAD per
# thread. Measured with benchmarks/feature_tiles.py on an H200 (bf16, q and k >= 256 MiB): 8
# heads of one token on 2 warps streamed best in every case, 0.96-0.98 of a copy; one head of 8
# tokens per step reached 0.84-0.92.
MROPE_STEP_ELEMENTS = 1024
MROPE_HEADS_PER_STEP = 8
MROPE_ELEMENTS_PER_THREAD = 16
MROPE_PROGRAMS_PER_SM = 8      # fewer: split the batch, then the heads


@lru_cache(maxsize=None)
def device_tiles(device_index: int) -> tuple:
    """(SM count, the finished kernel's tile knobs) of a GPU: looked up once per device."""
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, tile_knobs(props.name)


def tile_knobs(gpu_name: str) -> dict:
    """The finished kernel's tile knobs of the GPU of this name (torch.cuda.get_device_name's),
    as launch.pick_tiles takes them: TILES_BY_GPU's, the defaults where it names none."""
    knobs = TILES_BY_GPU.get(gpu_name, {})
    return dict(tile_loop=knobs.get("loop", TILE_LOOP),
                tile_noloop=knobs.get("noloop", TILE_NOLOOP),
                tile_wide=knobs.get("wide", TILE_WIDE))


@lru_cache(maxsize=None)
def exact_loop_tile(device_index: int) -> tuple:
    """The batch-loop tile knob of table-free angles on this GPU."""
    knobs = TILES_BY_GPU.get(torch.cuda.get_device_properties(device_index).name, {})
    return knobs.get("exact_loop", knobs.get("loop", TILE_LOOP))


def device_index(device: torch.device) -> int:
    """A CUDA device's index (the current device for a bare "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def hopper_or_newer(device: torch.device) -> bool:
    """A CUDA GPU of compute capability 9 (Hopper) or newer: TMA, programmatic dependent launch
    (False where CUDA is not available, as when kernels are compiled for a GPU on a machine
    without one). Asked once per device: plans ask on every call."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return _capability_major(device_index(device)) >= 9


@lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def launches_early(device: torch.device) -> bool:
    """Can a kernel on `device` be launched before the one before it ends (programmatic
    dependent launch: hopper_or_newer, not the interpreter), and is it wanted (EARLY_LAUNCH)?
    Such a kernel waits (griddepcontrol.wait) before it reads what the one before it writes."""
    return not INTERPRET and EARLY_LAUNCH and hopper_or_newer(device)


def multiprocessors(device: torch.device) -> int:
    """The SM count of a CUDA device (looked up once per device)."""
    return device_tiles(device_index(device))[0]
