"""The finished kernel's no-loop tile on an H200: (elements a thread, warps) = (64, 4), the
H100's choice, against (64, 2), under CUDA-graph replay (where the eager route keeps no cos/sin
rows and batch-1 and decode calls run the finished kernel).

benchmarks/tile_sweep.py found, at s16384 b1 h32 d128 bf16, the rotation at 0.927 of a copy on
one token of 32 heads a program with 2 warps, against 0.900 on the shipped two tokens with 4
warps (tile_sweep-nvidia-h200-20261204-1157.csv, one timing each). The no-loop tile also serves
decode (s1 b64: the batch split into chunks shorter than BATCH_LOOP_MIN) and thd. This probe
times those calls with each setting, in child processes (a setting is read when ropelib first
plans), alternating the settings over ROUNDS rounds, every call replayed from a CUDA graph
(`suite.graph_replay_ms`, 100 calls a graph) beside a device copy of the same bytes.

    python benchmarks/noloop_knob_probe.py --out DIR       # GPU, about 1 minute
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ((64, 4), (64, 2))
ROUNDS = 3
CASES = {   # name: Config keyword arguments (bf16, 32 heads of 128)
    "decode sbhd s1 b64": dict(seq_len=1, batch=64, layout="sbhd"),
    "decode bshd s1 b64": dict(seq_len=1, batch=64, layout="bshd"),
    "decode thd s1 b64": dict(seq_len=1, batch=64, layout="thd"),
    "decode sbhd start positions": dict(seq_len=1, batch=64, layout="sbhd",
                                        start_positions=True),
    "128 MiB sbhd s16384 b1": dict(seq_len=16384, batch=1, layout="sbhd"),
    "128 MiB bshd s16384 b1": dict(seq_len=16384, batch=1, layout="bshd"),
    "64 MiB thd s1024 b8": dict(seq_len=1024, batch=8, layout="thd"),
}


def child(setting: tuple) -> dict:
    from ropelib.kernels import tiles
    name = torch.cuda.get_device_name()
    tiles.TILES_BY_GPU.setdefault(name, {})["noloop"] = setting
    from ropelib.bench import compare, suite
    ropelib_provider = next(p for p in compare.providers() if p.name == "ropelib")
    out = {}
    for case_name, kw in CASES.items():
        case = compare.make_case(compare.Config(heads=32, head_dim=128, dtype="bf16", **kw),
                                 "cuda", seed=0)
        copy_once, _ = compare.copy_floor(case.tensors)
        rope_us = suite.graph_replay_ms(lambda: ropelib_provider.fn(case), 100)[0] * 1e3
        copy_us = suite.graph_replay_ms(copy_once, 100)[0] * 1e3
        out[case_name] = (rope_us, copy_us)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(tuple(int(v) for v in args.child.split(",")))))
        return 0
    runs = {s: [] for s in SETTINGS}
    for r in range(ROUNDS):
        for s in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
            proc = subprocess.run([sys.executable, __file__, "--child", f"{s[0]},{s[1]}"],
                                  capture_output=True, text=True, check=True)
            runs[s].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; no-loop tile "
             f"settings {SETTINGS}, {ROUNDS} alternating rounds, each a child process; µs per "
             "call replayed from a CUDA graph (100 calls), median over rounds; ratio = copy / "
             "call",
             f"{'case':32s} " + " ".join(f"{str(s):>22s}" for s in SETTINGS)]
    for case_name in CASES:
        cells = []
        for s in SETTINGS:
            rope = statistics.median(r[case_name][0] for r in runs[s])
            copy = statistics.median(r[case_name][1] for r in runs[s])
            spread = max(r[case_name][0] for r in runs[s]) - min(r[case_name][0] for r in runs[s])
            cells.append(f"{rope:7.2f} us ±{spread / 2:4.2f} {copy / rope:5.3f}")
        lines.append(f"{case_name:32s} " + " ".join(f"{c:>22s}" for c in cells))
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "noloop_knob_probe.log").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
