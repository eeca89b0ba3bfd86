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

The drop-ins plan (and Triton compiles) a kernel for each new case, which is CPU work: `--jobs N`
runs each mode as N processes at once, each taking every N-th case, and merges what they record.
`--csv FILE` writes the counts per mode and test function.

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


class _Shard:
    """A pytest plugin that keeps every `count`-th collected case, starting at `index`."""

    def __init__(self, index, count):
        self.index, self.count = index, count

    def pytest_collection_modifyitems(self, config, items):
        keep = [i % self.count == self.index for i in range(len(items))]
        config.hook.pytest_deselected(items=[it for it, k in zip(items, keep) if not k])
        items[:] = [it for it, k in zip(items, keep) if k]


class _Outcomes:
    """A pytest plugin that records each case's outcome (setup skips included)."""

    def __init__(self, path):
        self.by_case, self.path = {}, path

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            if report.nodeid not in self.by_case or report.outcome != "passed":
                self.by_case[report.nodeid] = report.outcome
        if report.when == "teardown":
            if len(self.by_case) % 500 == 0:
                self.save()   # a run cut short still leaves what it did
            import torch
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()   # processes running at once share the GPU's memory

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.by_case, f, indent=0, sort_keys=True)


def run(test_file: str, mode: str, extra, path, shard=(0, 1)) -> dict:
    import pytest
    _patch(mode)
    rec = _Outcomes(path)
    pytest.main([test_file, "-q", "-p", "no:cacheprovider", "--no-header", "-rN",
                 "--tb=line", *extra], plugins=[rec, _Shard(*shard)])
    rec.save()
    return rec.by_case


def counts_by_function(by_case: dict) -> dict:
    counts = collections.defaultdict(collections.Counter)
    for nodeid, outcome in by_case.items():
        counts[nodeid.split("::")[-1].split("[")[0]][outcome] += 1
    return counts


def write_csv(path: str, results: dict, te_commit: str) -> None:
    import csv
    try:
        import torch
        gpu = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        gpu = "unknown"
    try:
        from importlib.metadata import version
        te_version = version("transformer_engine")
    except Exception:  # noqa: BLE001
        te_version = "unknown"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "transformer_engine", "te_tests_commit", "mode", "test", "run",
                    "passed", "failed", "skipped"])
        for mode, by_case in results.items():
            for fn, c in sorted(counts_by_function(by_case).items()):
                w.writerow([gpu, te_version, te_commit, mode, fn, sum(c.values()), c["passed"],
                            c["failed"], c["skipped"]])


def summary(mode: str, by_case: dict) -> list:
    counts = counts_by_function(by_case)
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
    ap.add_argument("--jobs", type=int, default=1, help="processes per mode, run at once")
    ap.add_argument("--csv", help="write the counts per mode and test function here")
    ap.add_argument("--te-commit", default="", help="the TE commit the test file is from (CSV)")
    ap.add_argument("--shard", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    extra = argv[cut + 1:]   # after --: passed to pytest (e.g. -k 'not qkv')
    if a.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {a.jobs}")
    results = {}
    if len(a.modes) > 1 or a.jobs > 1:   # each process patches TE's module afresh
        import subprocess
        procs = []
        for mode in a.modes:
            for i in range(a.jobs):
                log = open(os.path.join(a.out, f"te-suite-{mode}-{i}.log"), "w")
                procs.append((mode, i, log, subprocess.Popen(
                    [sys.executable, __file__, a.test_file, "--modes", mode, "--out", a.out,
                     "--shard", str(i), str(a.jobs), "--", *extra],
                    stdout=log, stderr=subprocess.STDOUT)))
        for mode, i, log, proc in procs:
            proc.wait()
            log.close()
            part = os.path.join(a.out, f"te-suite-{mode}-{i}.json")
            if not os.path.exists(part):
                print(f"{mode} shard {i} recorded nothing (exit {proc.returncode}); see {log.name}")
                continue
            with open(part) as f:
                results.setdefault(mode, {}).update(json.load(f))
            os.remove(part)
        for mode, by_case in results.items():
            with open(os.path.join(a.out, f"te-suite-{mode}.json"), "w") as f:
                json.dump(by_case, f, indent=0, sort_keys=True)
    else:
        mode = a.modes[0]
        shard = tuple(a.shard) if a.shard else (0, 1)
        name = f"te-suite-{mode}-{shard[0]}.json" if a.shard else f"te-suite-{mode}.json"
        results[mode] = run(a.test_file, mode, extra, os.path.join(a.out, name), shard)
        print("\n".join(summary(mode, results[mode])))
        if a.csv:
            write_csv(a.csv, results, a.te_commit)
        return 0
    if a.csv:
        write_csv(a.csv, results, a.te_commit)
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
