"""Notebook 08, section 4b step e: which product of `y = a * b +/- c * d` a compiled kernel rounds
and which it fuses, read from the PTX's line info (ropelib.course.debug.ptx_products)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before ropelib's kernels are imported

from ropelib.course import debug as D  # noqa: E402

SOURCE = "def f(x1, x2, c, s):\n    y1 = x1 * c - x2 * s\n    y2 = x2 * c + x1 * s\n    z = x1\n"
PTX = """
	.loc	1 2 19                          // kernel.py:2:19
	mul.f32 	%r1, %r10, %r11;
	.loc	1 2 10, function_name $L__info_string0, inlined_at 1 9 14 // kernel.py:2:10
	neg.f32 	%r2, %r1;
	fma.rn.f32 	%r3, %r12, %r13, %r2;
	.loc	1 3 10                          // kernel.py:3:10
	mul.f32 	%r4, %r10, %r13;
	@%p1 fma.rn.f32 	%r5, %r11, %r12, %r4;
	.loc	1 4 5                           // kernel.py:4:5
	mul.f32 	%r6, %r10, %r10;
	.loc	2 3 19                          // other.py:3:19
	mul.f32 	%r7, %r10, %r11;
	.file	1 "/somewhere/else/kernel.py"
	.file	2 "/tmp/other.py"
"""


def test_ptx_products_reads_the_rounded_and_the_fused_product():
    found = D.ptx_products(PTX, SOURCE, "/tmp/x/kernel.py")   # matched by file name
    assert set(found) == {"y1", "y2"}                          # `z = x1` is no such line
    assert (found["y1"]["rounded"], found["y1"]["fused"]) == (["x2 * s"], ["x1 * c"])
    assert (found["y2"]["rounded"], found["y2"]["fused"]) == (["x2 * c"], ["x1 * s"])
    assert found["y2"]["mul.f32"] == 1 and found["y2"]["fma.rn.f32"] == 1   # other.py not counted
    assert found["y1"]["lines"][0].endswith("// column 19: x2 * s")


def test_ptx_products_without_an_fma_fuses_nothing():
    ptx = '\t.loc\t1 2 10\n\tmul.f32 \t%r1, %r2, %r3;\n\t.file\t1 "k.py"\n'
    assert D.ptx_products(ptx, SOURCE, "k.py")["y1"]["fused"] == []


def test_the_reproduction_kernel_compiled_here_makes_the_h200_runs_choice():
    """The reference run's PTX of the reproduction kernel (step e) fuses x1*c in y1 and x1*s in
    y2; the kernel compiled here for sm_90 makes the same choice."""
    found = D.repro_kernel_products()
    assert {y: (r["fused"], r["rounded"]) for y, r in found.items()} == {
        "y1": (["x1 * c"], ["x2 * s"]), "y2": (["x1 * s"], ["x2 * c"])}


def test_a_column_inside_a_product_names_that_product():
    """Triton 3.6 puts a multiply's line info a few columns into its product (3.9 on its first
    column): the product whose columns hold it is the one rounded."""
    ptx = ('\t.loc\t1 2 23\n\tmul.f32 \t%r1, %r2, %r3;\n\t.loc\t1 2 14\n'
           '\tfma.rn.f32 \t%r4, %r5, %r6, %r1;\n\t.file\t1 "k.py"\n')
    found = D.ptx_products(ptx, SOURCE, "k.py")["y1"]
    assert (found["rounded"], found["fused"]) == (["x2 * s"], ["x1 * c"])
