"""Notebook 03's prose against the committed data it reads: the numbers section 4 states in its
equations (Little's law for loads and for programs, the program floor) and section 5's sector
count, each read from its file here, and the sentences that say them."""
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

from ropelib.course import measured

ROOT = Path(__file__).resolve().parents[1]
run_notebooks = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
NB03 = ROOT / "notebooks" / "03-naive-triton-kernel.py"


def _markdown(path):
    """The markdown cells of a notebook (its .py or .ipynb path) as one text, one-spaced (a
    phrase may wrap)."""
    return " ".join(run_notebooks.notebook_markdown(path.with_suffix(".ipynb")).split())


@pytest.fixture(scope="module")
def md():
    return _markdown(NB03)


@pytest.fixture(scope="module")
def mech():
    return measured.mechanism("s4096-b8")


def test_littles_law_for_loads_with_its_factors(md):
    # 4.2: W_read / N_SM x L_idle = 2.15 TB/s / 132 x 350 ns ~ 5.6 KiB (notebook 05's numbers)
    need = measured.loads_in_flight_need()
    assert round(need["w_read"] / 1e12, 2) == 2.15
    assert need["sms"] == 132
    assert round(need["latency_ns"], -1) == 350
    assert round(need["kib_per_sm"], 1) == 5.6
    assert (r"\frac{2.15\ \text{TB/s}}{132} \times 350\ \text{ns} \approx 5.6\ \text{KiB of loads "
            r"in flight per SM,}") in md


def test_the_ceiling_and_the_resident_programs_of_the_two_one_warp_kernels(md, mech):
    # 4.2: both kernels could ask for 32 x 256 B = 8 KiB an SM; they ask for 18 and 31 resident
    # warps' 256 bytes: 4.5 and 7.7 KiB. The ceiling is the theoretical occupancy's; each
    # kernel's bound is its achieved occupancy's, and only that tells the two apart
    naive, reuse = mech["naive"], mech["batch_reuse"]
    for r in (naive, reuse):
        assert (r["occ_blocks_per_sm"], r["num_warps"], r["x_bytes_per_warp_step"]) == (32, 1, 256)
    assert [round(r["resident_warps"]) for r in (naive, reuse)] == [18, 31]
    assert [round(r["ncu_achieved_occupancy_pct"] / 100 * 64) for r in (naive, reuse)] == [18, 31]
    assert [f"{r['x_kib_per_sm']:.1f}" for r in (naive, reuse)] == ["4.5", "7.7"]
    assert r"$32 \times 256$ B = 8 KiB" in md
    assert r"\text{naive: } 18 \times 256\ \text{B} \approx 4.5\ \text{KiB}" in md
    assert r"31 \times 256\ \text{B} \approx 7.7\ \text{KiB}" in md
    # and the naive kernel's bound is below the need, notebook 04's above it
    need = measured.loads_in_flight_need()["kib_per_sm"]
    assert naive["x_kib_per_sm"] < need < reuse["x_kib_per_sm"]
    assert "were bytes in flight its limit, it would read at 0.8 of the copy's rate" in md


def test_the_program_floor_and_littles_law_for_programs(md, mech):
    # 4.3: t_GPU = 0.60 ns, t_SM = N_SM t_GPU = 80 ns; life = 18 x 80 ns ~ 1.4 us
    _, rows = measured.load("program_cost")
    empty = next(r for r in rows if r["kernel"] == "empty" and r["num_warps"] == 1)
    t_gpu = empty["us"] * 1e3 / empty["programs"]
    assert round(t_gpu, 2) == 0.60 and empty["sms"] == 132
    assert round(empty["sms"] * t_gpu) == round(empty["ns_per_program_per_sm"]) == 80
    assert (r"t_\text{GPU} = 0.60\ \text{ns}, \quad t_\text{SM} = N_\text{SM}\, t_\text{GPU} = "
            r"80\ \text{ns}") in md
    # the naive kernel sits on the floor: its time is the empty kernel's within 1 %
    assert abs(mech["naive"]["us"] / empty["us"] - 1) < 0.01
    resident = mech["naive"]["ncu_achieved_occupancy_pct"] / 100 * 64
    assert round(resident) == 18 and f"{mech['naive']['ncu_achieved_occupancy_pct']:.1f}" == "28.1"
    assert round(resident * empty["ns_per_program_per_sm"] / 1e3, 1) == 1.4
    assert r"\text{life} = \frac{18}{1 / 80\ \text{ns}} \approx 1.4\ \mu\text{s}" in md
    assert "about 18 resident (4.2's 28.1 % of 64 warp slots)" in md


def test_a_copys_sectors_in_section_5(md):
    # "A copy moves 2,097,152 sectors each way": [262144, 128] bf16 in 32-byte sectors, and what
    # the counters saw the whole-rows pass send to L2
    meta, rows = measured.load("access_counters")
    assert meta["shape"].startswith("[262144, 128] bf16")
    assert 262144 * 128 * 2 // 32 == 2_097_152
    whole = next(r for r in rows if r["group"] == "pair swap" and r["pattern"].startswith("whole"))
    assert whole["model_bytes"] / 2 / 32 == 2_097_152
    assert whole["l2_read_sectors"] == whole["l2_write_sectors"] == 2_097_152
    assert "A copy moves 2,097,152 sectors each way." in md


def test_the_exercise_checks_md_describes_record_loads(md):
    # exercises 4 and 5 say their checks record the loads; the checks do (test_exercises_naive)
    assert "records in the interpreter every address the masked case loads" in md
    assert "records the addresses the masked case loads" in md
