"""Run Transformer Engine's own RoPE tests with ropelib's drop-ins in place of TE's functions.

TE's test file (`tests/pytorch/test_fused_rope.py` in TE's repository; not shipped with the TE
wheels, so pass its path) imports `apply_rotary_pos_emb` and `apply_fused_qkv_rotary_pos_emb`
from `transformer_engine.pytorch.attention.rope`. Before the file is collected this script
replaces them there, so every case runs through:

    te        TE itself (nothing replaced): the cases TE passes on this machine
    dropins   ropelib.te for both paths (fused=True: ropelib's kernel; fused=False: ropelib's
              line-for-line copy of TE's plain-PyTorch path), and ropelib's fused QKV
    mixed     ropelib's kernel for fused=True against TE's own unfused path (fused=False)

    python benchmarks/te_test_suite.py PATH/test_fused_rope.py --modes te dropins mixed

Needs a CUDA GPU and transformer_engine. Prints one line per mode and test function
(passed / failed / skipped), writes the per-case outcomes to te-suite-<mode>.json (in --out),
and, with `te` among the modes, lists every case TE passes that another mode fails (none may).
"""
import argparse
import collections
import json
import os
import sys


def _patch(mode: str) -> None:
    import transformer_engine.pytorch  # noqa: F401  (before anything loads cuDNN)
    import transformer_engine.pytorch.attention.rope as te_rope

    import ropelib.te

    te_apply = te_rope.apply_rotary_pos_emb
    if mode == "dropins":
        te_rope.apply_rotary_pos_emb = ropelib.te.apply_rotary_pos_emb
        te_rope.apply_fused_qkv_rotary_pos_emb = ropelib.te.apply_fused_qkv_rotary_pos_emb
    elif mode == "mixed":
        def apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", start_positions=None,
                                 interleaved=False, fused=False, cu_seqlens=None, cp_size=1,
                                 cp_rank=0):
            fn = ropelib.te.apply_rotary_pos_emb if fused else te_apply
            return fn(t, freqs, tensor_format=tensor_format, start_positions=start_positions,
                      interleaved=interleaved, fused=fused, cu_seqlens=cu_seqlens,
                      cp_size=cp_size, cp_rank=cp_rank)
        te_rope.apply_rotary_pos_emb = apply_rotary_pos_emb
        te_rope.apply_fused_qkv_rotary_pos_emb = ropelib.te.apply_fused_qkv_rotary_pos_emb
    elif mode != "te":
        raise ValueError(f"mode must be te, dropins or mixed, got {mode!r}")


class _Outcomes:
    """A pytest plugin that records each case's outcome (setup skips included)."""

    def __init__(self, path):
        self.by_case, self.path = {}, path

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            if report.nodeid not in self.by_case or report.outcome != "passed":
                self.by_case[report.nodeid] = report.outcome
        if report.when == "teardown" and len(self.by_case) % 500 == 0:
            self.save()   # a run cut short still leaves what it did

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.by_case, f, indent=0, sort_keys=True)


def run(test_file: str, mode: str, extra, path) -> dict:
    import pytest
    _patch(mode)
    rec = _Outcomes(path)
    pytest.main([test_file, "-q", "-p", "no:cacheprovider", "--no-header", "-rN",
                 "--tb=line", *extra], plugins=[rec])
    rec.save()
    return rec.by_case


def summary(mode: str, by_case: dict) -> list:
    counts = collections.defaultdict(collections.Counter)
    for nodeid, outcome in by_case.items():
        counts[nodeid.split("::")[-1].split("[")[0]][outcome] += 1
    lines = []
    total = collections.Counter()
    for fn in sorted(counts):
        c = counts[fn]
        total.update(c)
        lines.append(f"{mode:8s} {fn:45s} {c['passed']:5d} passed {c['failed']:5d} failed "
                     f"{c['skipped']:5d} skipped")
    lines.append(f"{mode:8s} {'all':45s} {total['passed']:5d} passed {total['failed']:5d} failed "
                 f"{total['skipped']:5d} skipped")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("test_file")
    ap.add_argument("--modes", nargs="+", default=["dropins"], choices=["te", "dropins", "mixed"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    extra = argv[cut + 1:]   # after --: passed to pytest (e.g. -k 'not qkv')
    results = {}
    if len(a.modes) > 1:   # one process per mode: each patches TE's module afresh
        import subprocess
        for mode in a.modes:
            subprocess.run([sys.executable, __file__, a.test_file, "--modes", mode,
                            "--out", a.out, "--", *extra], check=False)
            with open(os.path.join(a.out, f"te-suite-{mode}.json")) as f:
                results[mode] = json.load(f)
    else:
        mode = a.modes[0]
        results[mode] = run(a.test_file, mode, extra, os.path.join(a.out, f"te-suite-{mode}.json"))
        print("\n".join(summary(mode, results[mode])))
        return 0
    lines = [line for mode in a.modes for line in summary(mode, results[mode])]
    bad = 0
    if "te" in results:
        te_passed = {k for k, v in results["te"].items() if v == "passed"}
        for mode in a.modes:
            if mode == "te":
                continue
            lost = sorted(k for k in te_passed if results[mode].get(k) != "passed")
            bad += len(lost)
            lines.append(f"{mode}: {len(lost)} of the {len(te_passed)} cases TE passes do not "
                         f"pass here" + (": " + ", ".join(lost[:10]) if lost else ""))
    text = "\n".join(lines)
    print("\n" + text)
    with open(os.path.join(a.out, "te-suite-summary.txt"), "w") as f:
        f.write(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
