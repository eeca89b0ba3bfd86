"""The study notebooks' tools: the exercise checks (`exercises`), the teaching kernels
(`kernels.naive`, `kernels.batch_reuse`, `kernels.ablation`), the finished kernel's ladder
(`ladder`), the allclose debugger (`debug`), the memory-access tracer (`access`), the notebook
widgets (`widgets`), the demo GPT (`model`), its compiled training step timed (`model_step`),
its context-parallel training (`context_parallel_training`) and rounds of timings read as
pairs (`rounds`). The product (`import ropelib`) never imports this package; the notebooks
and the course's tests do.
"""
