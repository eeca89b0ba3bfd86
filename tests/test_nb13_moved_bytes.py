"""Notebook 13's fractions of copy speed count the bytes a right answer moves: every tensor a
puzzle's timed case hands its kernel, except puzzle 5's bf16 angle table, which the worked
solution never reads."""
import torch

from ropelib.course import puzzles as pz


def _handed(case) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in case.args if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def test_moved_bytes_leave_out_only_puzzle5s_angle_table():
    for key, p in pz.PUZZLES.items():
        if p.big is None:
            continue
        case = p.big("cpu")
        moved, handed = pz._moved_bytes(case), _handed(case)
        if key == "long_context":
            table = case.args[1]
            assert table.dtype == torch.bfloat16 and "freqs" not in case.inputs
            assert handed - moved == table.numel() * 2 == 16_777_216
            assert moved == 67_633_408          # the committed CSV's "copy of the bytes moved"
        else:
            assert moved == handed, key
