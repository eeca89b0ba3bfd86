"""Context parallelism (ropelib.context_parallel, and ropelib.course.context_parallel_training
for the demo GPT): the dual-chunk split and its inverse, attention
with the causal mask by global positions, and 2-process training on gloo against 1-process
training of the same model on the same data (loss and every gradient)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ropelib
from ropelib import context_parallel as cp
from ropelib.course import context_parallel_training as cpt
from ropelib.course.model import GPT, GPTConfig, CharDataset

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _tiny_config(**kw):
    sizes = dict(vocab_size=len(set(TEXT)), block_size=16, n_layer=2, n_head=2, n_embd=16)
    return GPTConfig(**{**sizes, **kw})


# --- the split, pure PyTorch --------------------------------------------------------------------

@pytest.mark.parametrize("cp_size", [1, 2, 3, 4])
def test_shard_then_unshard_is_the_identity(cp_size, seeded):
    S = 2 * cp_size * 3
    x = torch.randn(2, S, 3, 5)
    shards = [cp.shard(x, cp_size, r) for r in range(cp_size)]
    assert all(s.shape == (2, S // cp_size, 3, 5) for s in shards)
    assert torch.equal(cp.unshard(shards), x)
    # along another dim too (sbhd: the sequence first)
    xs = x.transpose(0, 1).contiguous()
    assert torch.equal(cp.unshard([cp.shard(xs, cp_size, r, dim=0) for r in range(cp_size)], 0),
                       xs)


def test_dual_chunk_split_order():
    # S = 8, cp_size = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    pos = torch.arange(8)[None]
    assert cp.shard(pos, 2, 0).tolist() == [[0, 1, 6, 7]]
    assert cp.shard(pos, 2, 1).tolist() == [[2, 3, 4, 5]]
    assert cp.dual_chunk_positions(4, 2, 1).tolist() == [2, 3, 4, 5]
    # gathered rank-major [0 1 6 7 | 2 3 4 5] -> global order
    order = cp.global_order(4, 2)
    assert torch.tensor([0, 1, 6, 7, 2, 3, 4, 5])[order].tolist() == list(range(8))


@pytest.mark.parametrize("cp_size", [2, 3, 4])
def test_every_rank_gets_the_same_causal_work(cp_size):
    S = 2 * cp_size * 5
    work = [int((cp.dual_chunk_positions(S // cp_size, cp_size, r) + 1).sum())
            for r in range(cp_size)]                 # keys a causal query at p attends: p + 1
    assert len(set(work)) == 1, work
    held = torch.cat([cp.dual_chunk_positions(S // cp_size, cp_size, r) for r in range(cp_size)])
    assert sorted(held.tolist()) == list(range(S))  # every position held exactly once


def test_split_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="local sequence length must be even"):
        cp.dual_chunk_positions(3, 2, 0)
    with pytest.raises(ValueError, match="cp_rank"):
        cp.dual_chunk_positions(4, 2, 2)
    with pytest.raises(ValueError, match="cp_size"):
        cp.shard(torch.zeros(1, 8), 0, 0)
    with pytest.raises(ValueError, match="not a multiple of cp_size=3"):
        cp.shard(torch.zeros(1, 8), 3, 0)
    with pytest.raises(TypeError, match="ropelib.course.model.GPT"):
        cpt.context_parallel(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("cp_size", [2, 3])
def test_dual_chunk_attention_is_causal_attention_by_global_position(cp_size, seeded):
    B, H, S, D = 2, 3, 2 * cp_size * 4, 8
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for r in range(cp_size):
        got = cp.dual_chunk_attention(cp.shard(q, cp_size, r, dim=2), k, v, cp_size, r)
        torch.testing.assert_close(got, cp.shard(full, cp_size, r, dim=2), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="expected cp_size"):
        cp.dual_chunk_attention(q[:, :, :4], k, v, cp_size, 0)


@pytest.mark.gpu
def test_dual_chunk_attention_on_the_gpu_kernels(seeded):
    # bf16 on a GPU: the lower-right causal masks go to flash / memory-efficient attention
    cp_size, B, H, S, D = 4, 2, 4, 2 * 4 * 64, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    full = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    for r in range(cp_size):
        got = cp.dual_chunk_attention(cp.shard(q, cp_size, r, dim=2), k, v, cp_size, r)
        torch.testing.assert_close(got.double(), cp.shard(full, cp_size, r, dim=2),
                                   rtol=2e-2, atol=2e-2)


def test_kernel_rotates_each_shard_by_global_positions(device, seeded):
    cp_size, S = 2, 8
    x = torch.randn(2, S, 2, 8, device=device)
    freqs = ropelib.rope_freqs(S, 8).to(device)
    full = ropelib.apply_rope(x, freqs, layout="bshd")
    for r in range(cp_size):
        got = ropelib.apply_rope(cp.shard(x, cp_size, r), freqs, layout="bshd",
                                 cp_size=cp_size, cp_rank=r)
        torch.testing.assert_close(got, cp.shard(full, cp_size, r), rtol=0, atol=0)


@pytest.mark.parametrize("rope", ["ropelib", "reference"])
def test_one_rank_is_the_plain_model(rope, device, seeded):
    cfg = _tiny_config()
    torch.manual_seed(0)
    plain = GPT(cfg, rope).to(device)
    torch.manual_seed(0)
    wrapped = cpt.context_parallel(GPT(cfg, rope).to(device))   # no process group: cp_size 1
    assert isinstance(wrapped.blocks[0].attn, cpt.ContextParallelAttention)
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    idx = torch.randint(cfg.vocab_size, (2, 16), device=device)
    torch.testing.assert_close(wrapped(idx, idx)[1], plain(idx, idx)[1], rtol=0, atol=0)


def test_global_length_beyond_block_size_is_refused(seeded):
    model = cpt.context_parallel(GPT(_tiny_config(), "reference"))
    attn = model.blocks[0].attn
    q = torch.randn(1, 10, 2, 8)
    with pytest.raises(ValueError, match="more than block_size=16"):
        attn._rope(q, q, 2, 0)


# --- two processes on gloo against one ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out_dir):
    """One rank: the 1-process reference (plain GPT, whole batch; run before the process group
    exists, so it has no collectives) and the context-parallel run of the same seed and data;
    writes both for the test to compare."""
    import torch.distributed as dist

    data = CharDataset(TEXT)
    cfg = _tiny_config()
    x, y = data.get_batch("train", 2, cfg.block_size, torch.Generator().manual_seed(1))
    results = {rope: {} for rope in ("ropelib", "reference")}
    for rope, r in results.items():
        torch.manual_seed(0)
        ref = GPT(cfg, rope)
        _, loss = ref(x, y)
        loss.backward()
        r.update(ref_loss=loss.detach(), ref_grads={n: p.grad for n, p in ref.named_parameters()})
    # three optimizer steps through `train`, both ways (reference rope: the kernel's agreement is
    # covered above; this checks the loop, the shared batches, the clipping and the optimizer)
    train_kw = dict(steps=3, batch_size=2, lr=3e-3, warmup=1, seed=5)
    torch.manual_seed(0)
    h_one = cpt.train(GPT(cfg, "reference"), data, **train_kw)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for rope, r in results.items():
            torch.manual_seed(0)
            model = cpt.context_parallel(GPT(cfg, rope))
            _, local = model(cp.shard(x), cp.shard(y))
            local.backward()
            cp.all_reduce_grads(model)
            r.update(cp_loss=cp.mean_across_ranks(local), local_loss=local.detach(),
                     cp_grads={n: p.grad for n, p in model.named_parameters()})
        torch.manual_seed(0)
        h_cp = cpt.train(cpt.context_parallel(GPT(cfg, "reference")), data, **train_kw)
        results["train"] = {"cp": h_cp["train_loss"], "one": h_one["train_loss"],
                            "cp_size": h_cp["cp_size"]}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("cp")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("rope", ["ropelib", "reference"])
def test_two_ranks_match_one_process_loss_and_gradients(two_rank_results, rope):
    for rank, res in enumerate(two_rank_results):
        r = res[rope]
        torch.testing.assert_close(r["cp_loss"], r["ref_loss"], rtol=1e-5, atol=1e-6)
        assert r["ref_grads"].keys() == r["cp_grads"].keys()
        for name, g in r["ref_grads"].items():
            assert g is not None and g.abs().max() > 0, name
            torch.testing.assert_close(r["cp_grads"][name], g, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
    # the ranks' own losses differ (different tokens): the mean is not one rank's number
    a, b = (res[rope]["local_loss"] for res in two_rank_results)
    assert not torch.equal(a, b)


def test_two_ranks_train_like_one_process(two_rank_results):
    for res in two_rank_results:
        torch.testing.assert_close(torch.tensor(res["train"]["cp"]),
                                   torch.tensor(res["train"]["one"]), rtol=1e-5, atol=1e-6)
    # it trained: the loss changed from step to step
    losses = two_rank_results[0]["train"]["cp"]
    assert len(set(losses)) == 3
    assert two_rank_results[0]["train"]["cp_size"] == 2


def test_benchmark_dry_run_under_torchrun(tmp_path):
    out = tmp_path / "cp.csv"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(_free_port()), str(ROOT / "benchmarks" / "cp_train.py"),
         "--dry-run", "--compare-single", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "# torch: " in text and "# cp_size: 2" in text
    rows = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert rows[0].startswith("step,")
    assert len(rows) - 1 == 3                              # --dry-run: 3 steps
    assert "max |loss difference|" in proc.stdout
