"""Which tile the finished kernel should take at decode, timed as a decode loop runs it: under
CUDA-graph replay (GPU only).

At decode (one token of 64 sequences, 32 heads of 128, bf16: 512 KiB) a kernel's time is
mostly latency: the launch inside the graph, one round trip to memory, the tail of the last
programs. The floor run of 2026-11-29 (H200) timed apply_rope there at 0.65 of a copy under
CUDA graphs (thd 0.49) where torch.compile's kernel of Hugging Face's formula reached 0.87. The
planner gives decode the no-loop knob shrunk to MIN_TILE elements: programs of 4 heads on 4
warps, 4 elements a thread (8-byte accesses). This probe times, in one process and in
alternating rounds, for each decode case of the floor (sbhd, bshd, thd, sbhd with start
positions):

    copy            y.copy_(x) of the same bytes
    planned         ropelib.apply_rope(x, freqs): the tile the planner picks
    cos/sin         ropelib.apply_rope(x, cos=, sin=) with a bf16 table: sin/cos not evaluated
    table-free      ropelib.apply_rope(x, angles=ropelib.rope_angles(128)): the same
                    frequencies, the angles computed in the kernel from the position (no row
                    of a table to wait for; cos/sin by integer arithmetic and polynomials)
    tile h/c/w      apply_rope with the planner's tile replaced by BLOCK_H heads, batch chunks
                    of c entries, w warps (BLOCK_S = 1)
    torch.compile   Hugging Face's formula on bf16 tables (the floor's provider)

    python benchmarks/decode_tiles.py --out DIR [--rounds 3] [--no-tiles]  # ~2 min on an H200

Writes decode_tiles-<gpu>.csv: round, case, provider, us, ratio_to_copy (that round's copy),
and prints the best tiles per case last.
"""
import argparse
import itertools
import os

import torch

import ropelib
import ropelib.eager
from ropelib.bench import compare, suite
from ropelib.kernels import launch

CASES = (("sbhd", dict(layout="sbhd")), ("bshd", dict(layout="bshd")),
         ("thd", dict(layout="thd")), ("sbhd start positions", dict(start_positions=True)))
# (BLOCK_H, batch entries per program, warps) with 2 to 64 elements a thread
CANDIDATES = [(h, c, w) for h, c, w in itertools.product((2, 4, 8, 16, 32), (1, 2, 4),
                                                          (1, 2, 4, 8))
              if 2 <= h * 128 * c // (32 * w) <= 64 and h * 128 >= 32 * w * 2]
CALLS = 100


def _with_tiles(tile, fn):
    """fn() with the finished kernel's tile at S == 1 replaced by `tile` (plans forgotten)."""
    original = launch._tiles

    def fixed(x, S, B, heads, R, D, exact):
        if S != 1:
            return original(x, S, B, heads, R, D, exact)
        h, chunk, warps = tile
        return 1, h, chunk, warps

    launch._tiles = fixed
    ropelib.eager.SIGNATURES.clear()
    try:
        return fn()
    finally:
        launch._tiles = original
        ropelib.eager.SIGNATURES.clear()


def _graph_us(fn, tile=None):
    if tile is None:
        return suite.graph_replay_ms(fn, CALLS)[0] * 1e3
    return _with_tiles(tile, lambda: suite.graph_replay_ms(fn, CALLS)[0] * 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-tiles", action="store_true",
                    help="the planned tile, the cos/sin table and torch.compile only (~20 s)")
    args = ap.parse_args(argv)
    candidates = [] if args.no_tiles else CANDIDATES
    if not torch.cuda.is_available():
        raise SystemExit("decode_tiles.py times GPU kernels: run it on a machine with a GPU")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    best = {}
    compiled = compare._torch_compile()
    for name, fields in CASES:
        config = compare.Config(**dict(dict(seq_len=1, batch=64, heads=32, head_dim=128,
                                            dtype="bf16"), **fields))
        case = compare.make_case(config, "cuda")
        x, freqs = case.x, case.freqs
        f = freqs[:, 0, 0, :]
        cos16, sin16 = torch.cos(f).to(x.dtype), torch.sin(f).to(x.dtype)
        kw = dict(layout=config.layout, start_positions=case.start, cu_seqlens=case.cu_seqlens)
        want = ropelib.apply_rope(x, freqs, **kw)
        y = torch.empty_like(x)

        def rope():
            return ropelib.apply_rope(x, freqs, **kw)

        def rope_table():
            return ropelib.apply_rope(x, cos=cos16, sin=sin16, **kw)

        angles = ropelib.rope_angles(config.head_dim, device=x.device)

        def rope_table_free():
            return ropelib.apply_rope(x, angles=angles, **kw)

        for tile in candidates:   # every tile gives the planned bits
            got = _with_tiles(tile, rope)
            assert torch.equal(got, want), f"{name}: tile {tile} changes the output"
        comp = compiled.fn
        comp(case)
        providers = {"copy": (lambda: y.copy_(x), None), "planned": (rope, None),
                     "cos/sin": (rope_table, None), "table-free": (rope_table_free, None),
                     "torch.compile": (lambda: comp(case), None)}
        for tile in candidates:
            providers["tile %d/%d/%d" % tile] = (rope, tile)
        names = list(providers)
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else ["copy"] + names[:0:-1]
            us = {n: _graph_us(*providers[n]) for n in order}
            for n in names:
                rows.append(dict(round=rnd, case=name, provider=n, us=f"{us[n]:.4f}",
                                 ratio_to_copy=f"{us['copy'] / us[n]:.4f}"))
            print(f"{name} round {rnd}: copy {us['copy']:.2f} us, planned "
                  f"{us['copy'] / us['planned']:.3f}, cos/sin {us['copy'] / us['cos/sin']:.3f}, "
                  f"table-free {us['copy'] / us['table-free']:.3f}, "
                  f"torch.compile {us['copy'] / us['torch.compile']:.3f}", flush=True)
        med = {}
        for n in names:
            rs = sorted(float(r["ratio_to_copy"]) for r in rows
                        if r["case"] == name and r["provider"] == n)
            med[n] = rs[len(rs) // 2]
        best[name] = sorted(med.items(), key=lambda kv: -kv[1])
    path = compare.write_csv(rows, os.path.join(args.out,
                                                f"decode_tiles-{compare.gpu_slug()}.csv"),
                             meta=compare.environment_meta(),
                             fields=["round", "case", "provider", "us", "ratio_to_copy"])
    print("wrote", path)
    for name, ranked in best.items():
        fixed = {n: r for n, r in ranked if not n.startswith("tile")}
        print(f"\n{name}: planned {fixed['planned']:.3f}  cos/sin {fixed['cos/sin']:.3f}  "
              f"table-free {fixed['table-free']:.3f}  "
              f"torch.compile {fixed['torch.compile']:.3f}  (median ratio to copy)")
        for n, r in [kv for kv in ranked if kv[0].startswith("tile")][:6]:
            print(f"   {n:14s} {r:.3f}")


if __name__ == "__main__":
    main()
