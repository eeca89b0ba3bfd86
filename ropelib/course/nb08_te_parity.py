"""Notebook 08, section 4b: a kernel's output set beside Transformer Engine's, bit for bit.

Section 4b counts the elements whose bits differ from TE's fused RoPE, for each change to a
kernel, on two inputs of the committed GPU runs (`debug.te_bits_case`: ``nb_gpu``, bf16 S=512
B=2 H=8 D=128, and ``nb_cpu_fp32``, fp32 S=32 B=2 H=2 D=32). This module is the harness the
section runs on; what the learner edits and reads (the kernels, the combine lines, the cells that
prove which change did it) stays in the notebook.

TE's side of a case (`te_side`): TE's output, TE's own fp32 cos and sin and the angles. Where TE
runs here (``live``: TE installed, a GPU), TE computes them now on the case's inputs, drawn
again; elsewhere they are the ones stored from the GPU run. `TeParity` holds that side for the
section's cases, with the section's kernel (`_rope_combine_kernel`'s signature, the notebook's
own copy), the launcher that starts it (the notebook's `launch_combine`; by default
`debugging.launch`) and the labels its tables print, and runs kernels against it:

- `run_kernel` / `check_bits`: the kernel with a combine line, compiled with contraction off as
  `debugging.check_te_combine` compiles it, and the count of elements whose bits differ;
- `kernel_cos_sin`, `source_values`, `source_outputs`: step b's cos/sin sources, their values
  and the outputs they give, measured here or read from the committed run;
- `repro_bits`: section 1's reproduction kernel (the learner's copy, or the course's) on a case,
  with TE's own cos/sin or the angles.

`run_row`, `gpu_row`, `case_label`, `fmt_count`, `ptx_registers` and `agreement` read the
committed runs and label what the tables print.
"""
from typing import Optional

import torch

from . import debug
from .exercises import debugging

__all__ = ["run_row", "gpu_row", "case_label", "fmt_count", "ptx_registers", "ones_then_zeros",
           "te_side", "agreement", "TeParity"]


# --- reading the committed runs ---------------------------------------------------------------

def run_row(run: dict, variant: str, key: str = "nb_gpu") -> dict:
    """A committed run's row for one variant (n_differ, max_abs_diff, hist, ...)."""
    return {r["variant"]: r for r in run["scenarios"][key]["rows"]}[variant]


def gpu_row(case, variant: str) -> int:
    """The elements whose bits differ from TE's in a committed case's row for `variant`."""
    return case.rows[variant]["n_differ"]


def case_label(case) -> str:
    """'bf16 S=512 B=2 H=8 D=128': a case's dtype and shape, as the tables name it."""
    dt = {torch.bfloat16: "bf16", torch.float32: "fp32"}[case.x.dtype]
    return dt + " S={} B={} H={} D={}".format(*case.x.shape)


def fmt_count(v: Optional[int]) -> str:
    """A count with thousands separators, or "—": none taken."""
    return "—" if v is None else f"{v:,}"


def ptx_registers(line: str) -> list:
    """The registers of one PTX instruction, destination first."""
    return [r.strip(",;") for r in line.split()[1:]]


def agreement(run: dict, reference: dict) -> tuple:
    """(rows equal to the reference run's in every field, the reference run's rows, `run`'s
    rows with a PTX tail, whether TE's stored outputs and TE's cos/sin equal the reference run's
    bit for bit)."""
    same = n = n_ptx = 0
    tensors_equal = True
    for key in reference["scenarios"]:
        a, b = debug.te_bits_case(run, key), debug.te_bits_case(reference, key)
        n, n_ptx = n + len(b.rows), n_ptx + sum("ptx_tail" in r for r in a.rows.values())
        same += sum(a.rows.get(v) == r for v, r in b.rows.items())
        tensors_equal &= torch.equal(a.te_cos, b.te_cos) and torch.equal(a.te_sin, b.te_sin)
        tensors_equal &= (a.te is None) == (b.te is None) and (a.te is None or
                                                              torch.equal(a.te, b.te))
    return same, n, n_ptx, tensors_equal


# --- TE's side --------------------------------------------------------------------------------

def ones_then_zeros(S: int, half: int) -> torch.Tensor:
    """x = (1 | 0) [S, 1, 1, 2 half]: a rotate-half RoPE of it outputs its own (cos | sin)."""
    return torch.cat((torch.ones(S, 1, 1, half), torch.zeros(S, 1, 1, half)), -1)


def te_side(case, device, live: bool) -> dict:
    """TE's output, TE's own cos and sin, and the angles, for the case's inputs: computed by TE
    on this GPU (live), else the ones stored from the GPU run. CPU tensors."""
    if not live:
        return {"te": case.te, "cos": case.te_cos, "sin": case.te_sin, "angles": case.angles}
    x, ang = debug.te_bits_inputs(case.scenario, device)
    S, half = ang.shape
    freqs4 = torch.cat((ang, ang), dim=-1).view(S, 1, 1, 2 * half)
    cs = debug.te_fused(ones_then_zeros(S, half).to(device), freqs4).float()[:, 0, 0]
    return {"te": debug.te_fused(x, freqs4).cpu(), "cos": cs[:, :half].cpu(),
            "sin": cs[:, half:].cpu(), "angles": ang.cpu()}


# --- kernels against TE's side ----------------------------------------------------------------

class TeParity:
    """Section 4b's kernel run against TE's side of each case, counting the elements whose bits
    differ.

    Args:
        kernel: the section's kernel, `_rope_combine_kernel`'s signature (the notebook's copy);
            passed to `launch` as its first argument. None lets the launcher choose (the
            notebook's `launch_combine` then reads `_rope_combine_kernel` when it runs, so an
            edited kernel takes effect without building TeParity again).
        side: {case.key: te_side(case, ...)}, TE's side of every case the section runs.
        device: where the kernels run; a CUDA device is a GPU, whose own cos/sin sources
            (`source_values`, `source_outputs`) are measured here rather than read from the file.
        sincos: where check_bits takes cos and sin from by default: "tl" (a GPU), "table" (the
            CPU: TE's own table, since the interpreter's tl.cos is NumPy's).
        here_name: this machine, as the tables name it ("CPU, Triton interpreter" or the GPU's).
        te_where: what the counts compare with (TE run live here, or TE's stored output).
        reference_col: the committed run's column name, where a count is read from the file.
        launch: the launcher, called as `debugging.launch` is: (kernel, combine, x, angles,
            cos, sin, sincos=..., enable_fp_fusion=...) -> y fp32 (None: `debugging.launch`);
            notebook 08 passes its own `launch_combine`.
    """

    def __init__(self, kernel, side: dict, device, *, sincos: str, here_name: str,
                 te_where: str, reference_col: str, launch=None):
        self.kernel, self.side, self.device = kernel, side, device
        self.launch = debugging.launch if launch is None else launch
        self.gpu = torch.device(device).type == "cuda"
        self.sincos, self.here_name, self.te_where = sincos, here_name, te_where
        self.measured = f"here ({here_name})"     # the "measured on" column: here ...
        self.reference_col = reference_col        # ... or the committed run

    def run_kernel(self, case, combine_fn, sincos: Optional[str] = None, table=None,
                   fusion: bool = False) -> torch.Tensor:
        """The kernel on the case's inputs, rounded to the case's dtype; table: (cos, sin) for
        "table", default TE's own. Compiled with contraction off, as the grader compiles it:
        every product the line leaves outside a tl.fma is rounded. fusion=True lets a GPU
        compiler contract as it chooses (the interpreter never contracts)."""
        sincos = self.sincos if sincos is None else sincos
        side = self.side[case.key]
        cos, sin = table if table is not None else (side["cos"], side["sin"])
        y = self.launch(self.kernel, combine_fn,
                        *(t.to(self.device) for t in (case.x, side["angles"], cos, sin)),
                        sincos=sincos, enable_fp_fusion=fusion)
        return y.to(case.x.dtype).cpu()

    def check_bits(self, case, combine_fn, sincos: Optional[str] = None, table=None,
                   quiet: bool = False, fusion: bool = False) -> dict:
        """Run the kernel and count the elements whose bits differ from TE's output:
        {"n": count, "hist": {steps apart: elements}, "y": output, "differ": mask}."""
        y, te = self.run_kernel(case, combine_fn, sincos, table, fusion), self.side[case.key]["te"]
        differ = debug.bits_differ(y, te)
        n = int(differ.sum())
        steps = debug.steps_apart(y, te)[differ]
        hist = dict(zip(*(v.tolist() for v in torch.unique(steps, return_counts=True))))
        if not quiet:
            print(f"{case_label(case)}, run here ({self.here_name}), vs {self.te_where}: " + (
                f"0 of {y.numel():,} elements differ: bit for bit" if not n else
                f"{n} of {y.numel():,} elements differ; {case_label(case).split()[0]} steps "
                f"apart -> count: {hist}"))
        return {"n": n, "hist": hist, "y": y, "differ": differ}

    # step b: where cos and sin come from

    def kernel_cos_sin(self, case, sincos: str, combine_fn) -> tuple:
        """The cos and sin the kernel computes from the case's angles: x = (1 | 0) makes its
        output (c | s) under `combine_fn`, the line as written."""
        ang = self.side[case.key]["angles"]
        S, half = ang.shape
        y = self.launch(self.kernel, combine_fn,
                        *(t.to(self.device) for t in (ones_then_zeros(S, half), ang, ang, ang)),
                        sincos=sincos, enable_fp_fusion=False)
        y = y.cpu()[:, 0, 0]
        return y[:, :half], y[:, half:]

    def source_values(self, case, src: str, tables: dict, gpu_sources: tuple,
                      combine_fn) -> tuple:
        """(cos entries != TE's, sin entries != TE's, entries, where measured) for one cos/sin
        source: `tables` {src: (cos, sin)} made on the CPU; a GPU's own sources (`gpu_sources`)
        measured on a GPU, read from the committed run elsewhere; the kernel's own through
        `combine_fn`."""
        side = self.side[case.key]
        theta = side["angles"]
        if src in gpu_sources and not self.gpu:
            r = case.sincos[src]
            return r["cos"]["n_differ"], r["sin"]["n_differ"], r["cos"]["numel"], \
                self.reference_col
        if src in tables:
            c, s = tables[src]
        elif src == "table_fp32":
            c = torch.cos(theta.to(self.device)).cpu()
            s = torch.sin(theta.to(self.device)).cpu()
        else:
            c, s = self.kernel_cos_sin(case, src, combine_fn)
        n_cos, n_sin = (int(debug.bits_differ(t, side[k]).sum()) for t, k in ((c, "cos"),
                                                                              (s, "sin")))
        return n_cos, n_sin, c.numel(), self.measured

    def source_outputs(self, case, src: str, tables: dict, gpu_sources: tuple,
                       combines: tuple) -> tuple:
        """(elements != TE: the line as written without contraction, the fma line; where) for
        one cos/sin source; `combines` = (the line as written, the fma line)."""
        if src in gpu_sources and not self.gpu:
            nofuse = case.rows.get(f"free_sub-nofuse/{src}")    # not every source ran without it
            return (None if nofuse is None else nofuse["n_differ"],
                    gpu_row(case, f"fma_xc/{src}"), self.reference_col)
        theta = self.side[case.key]["angles"]
        if src in tables or src == "table_fp32":
            sincos = "table"
            table = (tuple(t.to(self.device) for t in tables[src]) if src in tables else
                     (torch.cos(theta.to(self.device)), torch.sin(theta.to(self.device))))
        else:
            sincos, table = src, None
        n = [self.check_bits(case, fn, sincos, table, quiet=True)["n"] for fn in combines]
        return n[0], n[1], self.measured

    # section 1's reproduction kernel

    def repro_bits(self, case, use_fma: bool, from_angles: bool = False,
                   input_dtype_math: bool = False, kernel=None, launch=None) -> int:
        """A section-1 kernel (`kernel`, the learner's copy; None: the course's) on a te-bits
        case: the elements whose bits differ from TE's output. Sin/cos from TE's own table (in
        x's dtype, with the math, when input_dtype_math), or with from_angles from
        tl.cos/tl.sin of the angles. `launch`: the launcher, called as `debug.rope_unsloth_repro`
        is (None: that one); notebook 08 passes its own `launch_repro`."""
        launch = debug.rope_unsloth_repro if launch is None else launch
        side = self.side[case.key]
        S, B, H, D = case.x.shape
        rows = (case.x.transpose(0, 1).contiguous().to(self.device)
                .view(B * S, H, D))                                    # bshd rows b*S + s
        if from_angles:
            cos, sin = side["angles"].contiguous().to(self.device), None
        else:
            tdt = case.x.dtype if input_dtype_math else torch.float32
            cos, sin = (side[k].to(tdt).contiguous().to(self.device) for k in ("cos", "sin"))
        launch(rows, cos, sin, seq_len=S, from_angles=from_angles,
               compute_fp32=not input_dtype_math, use_fma=use_fma, kernel=kernel)
        y = rows.view(B, S, H, D).transpose(0, 1).cpu()                 # back to sbhd
        return int(debug.bits_differ(y, side["te"]).sum())
