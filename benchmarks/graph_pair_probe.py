"""Two training steps captured in CUDA graphs in one process, then replayed (notebook 09's
`graphed_step`, from ropelib.course.cuda_graph_step): does the first graph's replay survive the
second capture?

    python benchmarks/graph_pair_probe.py                 # both ways, each in its own process
    python benchmarks/graph_pair_probe.py --arm held      # one way: the replay holds the optimizer
    python benchmarks/graph_pair_probe.py --arm freed     # the optimizer freed when capture returns

notebook 09's model (6 layers, 384 wide, 6 heads, batch 64 x 256, bf16 autocast), ropelib's
RoPE and the PyTorch reference, each step warmed on a side stream and captured with AdamW
(`capturable=True`) by `graphed_step`. "held" keeps the replay it returns, which holds the graph
and the optimizer; "freed" keeps only the graph's own replay and lets the optimizer go.
`torch.cuda.graph` empties the allocator's cache when a capture starts, so memory a graph still
reads but nobody holds is handed back to the driver: "freed" is expected to end in an illegal
memory access, "held" to replay cleanly. Each arm runs in a child process, because an illegal
access leaves the CUDA context unusable. Prints one line per arm.
"""
import argparse
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def captured_replay(model, x, y, hold: bool):
    """The step's replay from `ropelib.course.cuda_graph_step.graphed_step` (the notebook's), as
    the arm keeps it: held, the replay that holds the graph and the optimizer; freed, only the
    graph's own `replay` (it holds the graph, not the optimizer), the held replay dropped and
    garbage collected, so the optimizer's state is freed before the next capture."""
    import gc
    from ropelib.course.cuda_graph_step import graphed_step
    replay = graphed_step(model, x, y)
    if hold:
        return replay
    graph_only = replay.holds[0].replay
    del replay
    gc.collect()
    return graph_only


def run_arm(hold: bool) -> str:
    import torch
    sys.path.insert(0, str(ROOT))
    from ropelib.course.model import GPTConfig, build
    cfg = GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 65, (64, 256), generator=gen).cuda() for _ in range(2))
    models = {rope: build(cfg, rope, seed=0, device="cuda") for rope in ("ropelib", "reference")}
    replays = {rope: captured_replay(m, x, y, hold) for rope, m in models.items()}
    rng = random.Random(1)
    for _ in range(12):
        order = list(replays)
        rng.shuffle(order)
        for rope in order:
            for _ in range(20):
                replays[rope]()
            torch.cuda.synchronize()
    return "12 rounds of 20 replays of both graphs: ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", choices=("held", "freed"))
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it captures and replays CUDA graphs)")
    if args.arm:
        print(run_arm(args.arm == "held"), flush=True)
        return
    for arm in ("held", "freed"):
        r = subprocess.run([sys.executable, __file__, "--arm", arm], capture_output=True,
                           text=True, timeout=300)
        said = (r.stdout.strip().splitlines() or [""])[-1]
        err = [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:]
        print(f"{arm:6s} exit {r.returncode}: {said or (err[0] if err else r.stderr[-300:])}",
              flush=True)


if __name__ == "__main__":
    main()
