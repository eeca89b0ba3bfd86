"""The study notebooks' tools: the exercise checks (`exercises`), the teaching kernels
(`kernels.naive`, `kernels.batch_reuse`, `kernels.ablation`), the finished kernel's ladder
(`ladder`), the allclose debugger (`debug`), the memory-access tracer (`access`), the notebook
widgets (`widgets`), the demo GPT (`model`), its compiled training step timed (`model_step`),
its context-parallel training (`context_parallel_training`), its training step captured in a
CUDA graph (`cuda_graph_step`), its training steps timed in interleaved rounds
(`nb09_step_rounds`) and a step's clocks drawn (`nb09_step_clocks`), rounds of timings read as
pairs (`rounds`), the timers of the committed host-time probes (`probe_timers`) and notebook 05's
appendix checks (`checks_nb05`).
The product (`import ropelib`) never imports this package; the notebooks
and the course's tests do.
"""
