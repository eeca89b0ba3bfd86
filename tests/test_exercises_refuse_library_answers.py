"""Every exercise check refuses an answer that is ropelib's work instead of the learner's.

The other exercise tests refuse, check by check, the library function that computes the very
thing asked for and the worked solution handed in. This file fills what they leave out, for
every check at once:

* a function answer that returns the right values, computed by the learner's own code, but calls
  ropelib's finished functions on the way (`ropelib.apply_rope`, `apply_rope_qk`, the
  Transformer Engine and Hugging Face drop-ins, `multi_axis_frequencies`,
  `ropelib.context_parallel`), a teaching kernel, or another exercise's worked solution, is
  refused by the checks of notebooks 00-04, 06, 07, 08, 09, 10 and 11 that take a function
  (the ones `test_exercises_answers_are_code` does not already try this way; notebook 06's
  launcher of exercise 3 is the learner's own launcher of their own kernel); the same function
  without the call passes, so the refusal is the call's; a blank answer (its body still `...`)
  to each of these checks is a ❌ line, never an exception;
* a kernel answer that is the learner's own @triton.jit kernel with the worked solution's
  signature whose body only calls the worked solution (or, in notebook 12, the teaching kernel it
  is graded against) is refused by every kernel check of notebooks 00-12 (exercise 1b of
  notebook 05 through exercise 1's check, which it runs first; notebook 12's persistent kernel
  with a last constexpr PROGRAMS after the teaching kernel's parameters) and by every puzzle of
  notebook 13, with a message that names the kernel it reached;
* notebook 09's cached attention answered by the course model's own cached attention is
  refused.

The last sections hold answers that are not the learner's code by a way round the watch: a call
into ropelib from a thread the answer starts, an answer that switches the watch off, notebook
08's trap looked up in the check's own cases, the work handed to another process (started by the
answer, or a pool started before the check), and the library's results computed before the check
ran, on its inputs (recorded from an earlier run) and returned from a table. Each is refused, or
fails at the case the check draws when it runs.

Shapes are the checks' own (small, for Triton's interpreter); a refusal stops a check at its
first case, before any kernel runs.
"""
import ast
import concurrent.futures
import inspect
import itertools
import multiprocessing
import multiprocessing.pool
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ropelib  # noqa: E402
from ropelib import context_parallel, frequencies, mrope, reference  # noqa: E402
from ropelib import hf as rope_hf  # noqa: E402
from ropelib import te as rope_te  # noqa: E402
from ropelib.course import puzzles as pz  # noqa: E402
from ropelib.course.exercises import (  # noqa: E402
    at_scale, backward_kernel, basics, debugging, finished_kernel, flat_pass, grid_kernel,
    in_a_model, kernels, measuring, multi_axis, naive_kernel, pairs_pass, qkv_epilogue,
    yardstick)
from ropelib.course import load_schedule, nb08_repair  # noqa: E402
from ropelib.course.exercises import (  # noqa: E402
    layouts, nb00_program_floor, nb00_strided_copy, nb01_angle_kernel, nb02_lean_chain,
    nb02_table_mul, nb04_two_rows, nb06_interleaved, nb09_one_angle, nb11_cp_shard)
from ropelib.course.kernels import naive, qkv_teaching  # noqa: E402
from loading import load_file, scratch_folder, written_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_own_code_tests = load_file("own_code_tests_refuse", ROOT / "tests" / "test_own_code.py")
learner_copy = _own_code_tests.learner_copy     # a solution as a learner who typed it has it
# notebook 06, exercise 3: a learner's launcher of their own backward kernel (exercise 2's)
_backward_tests = load_file("grid_backward_tests_refuse",
                            ROOT / "tests" / "test_exercises_grid_backward.py")


# --- calls into ropelib whose result the answer does not need ----------------------------------
# (their inputs are made here, outside the checks)

_X = torch.randn(2, 1, 1, 4)
_F = frequencies.rope_freqs(2, 4)
_COS, _SIN = frequencies.rope_cos_sin(2, 4)
_Q_BSHD = torch.randn(1, 2, 1, 4)

SIDE_CALLS = {
    "ropelib.apply_rope": (lambda: ropelib.apply_rope(_X, _F), "called ropelib's apply_rope"),
    "ropelib.apply_rope_qk": (lambda: ropelib.apply_rope_qk(_X, _X.clone(), _F),
                              "called ropelib's apply_rope_qk"),
    "the TE drop-in": (lambda: rope_te.apply_rotary_pos_emb(_X, _F, tensor_format="sbhd"),
                       "called ropelib's apply_rotary_pos_emb (ropelib/te.py)"),
    "the HF drop-in": (lambda: rope_hf.apply_rotary_pos_emb(_Q_BSHD.transpose(1, 2),
                                                            _Q_BSHD.transpose(1, 2).clone(),
                                                            _COS[None], _SIN[None]),
                       "called ropelib's apply_rotary_pos_emb (ropelib/hf.py)"),
    "multi_axis_frequencies": (lambda: mrope.multi_axis_frequencies(8, [1, 1, 2], 1e4),
                               "called ropelib's multi_axis_frequencies"),
    "ropelib.context_parallel": (lambda: context_parallel.dual_chunk_positions(2, 2, 0),
                                 "called ropelib's dual_chunk_positions"),
    "a teaching kernel": (lambda: naive.rope_naive(_X, _F), "called ropelib's rope_naive"),
    "another exercise's worked solution": (lambda: at_scale.solution_paged_slot([0], 1, 0),
                                           "called ropelib's solution_paged_slot"),
}


def _after(side, own):
    """own's right answer, after a call into ropelib whose result it throws away."""
    def answer(*args, **kwargs):
        side()
        return own(*args, **kwargs)
    return answer


# --- the function checks and a learner's own right answer for each -----------------------------

def _device_rule(has_gpu, interpret):
    return "cuda" if has_gpu and not interpret else "cpu"


def _own(solution):
    return lambda: learner_copy(solution)


FUNCTION_CHECKS = {
    "00 ex1 check_device": (basics.check_device, lambda: _device_rule),
    "01 ex1 check_rotation_matrix": (basics.check_rotation_matrix,
                                     _own(basics.solution_rotation_matrix)),
    "01 ex2 check_relative_score": (basics.check_relative_score,
                                    _own(basics.solution_relative_score)),
    "01 ex3 check_rotate_half": (basics.check_rotate_half, _own(basics.solution_rotate_half)),
    "02 ex2 check_cos_sin_from_freqs": (basics.check_cos_sin_from_freqs,
                                        _own(basics.solution_cos_sin_from_freqs)),
    "03 ex1 check_naive_grid": (kernels.check_naive_grid, _own(kernels.solution_naive_grid)),
    "03 ex2 check_row_index": (kernels.check_row_index, _own(kernels.solution_row_index)),
    "03 ex3 check_half_tile": (kernels.check_half_tile, _own(kernels.solution_half_tile)),
    "04 ex1 check_angle_bytes": (kernels.check_angle_bytes, _own(kernels.solution_angle_bytes)),
    "04 ex2 check_floor_ms": (kernels.check_floor_ms, _own(kernels.solution_floor_ms)),
    "04 ex3 check_percent_of_copy": (kernels.check_percent_of_copy,
                                     _own(kernels.solution_percent_of_copy)),
    "06 ex1 check_backward_matrix": (kernels.check_backward_matrix,
                                     _own(kernels.solution_backward_matrix)),
    "07 ex2 check_host_or_device": (measuring.check_host_or_device,
                                    _own(measuring.solution_host_or_device)),
    "08 normwise-error check_normwise_error": (debugging.check_normwise_error,
                                    _own(debugging.solution_normwise_error)),
    "08 recovered-positions check_recovered_positions": (
        debugging.check_recovered_positions, _own(debugging.solution_recovered_positions)),
    "08 name-the-trap check_trap_name": (debugging.check_trap_name,
                                         _own(debugging.solution_trap_name)),
    "10 ex1 check_axis_of_pairs": (multi_axis.check_axis_of_pairs,
                                   _own(multi_axis.solution_axis_of_pairs)),
    "10 ex2 check_text_then_image": (multi_axis.check_text_then_image,
                                     _own(multi_axis.solution_text_then_image)),
    "11 ex1 check_dual_chunk_positions": (at_scale.check_dual_chunk_positions,
                                          _own(at_scale.solution_dual_chunk_positions)),
    "11 ex3 check_paged_slot": (at_scale.check_paged_slot, _own(at_scale.solution_paged_slot)),
    "00 ex1 check_call_rates": (basics.check_call_rates, _own(basics.solution_call_rates)),
    "00 ex2 check_program_floor": (nb00_program_floor.check_program_floor,
                                   _own(nb00_program_floor.solution_program_floor_us)),
    "00 ex4 check_max_saving": (nb00_strided_copy.check_max_saving,
                                _own(nb00_strided_copy.solution_max_saving_us)),
    "02 ex1 check_thd_cp_positions": (layouts.check_thd_cp_positions,
                                      _own(layouts.solution_thd_cp_positions)),
    "02 ex2 check_hf_cos_sin": (layouts.check_hf_cos_sin, _own(layouts.solution_hf_cos_sin)),
    "02 ex4 check_lean_chain": (nb02_lean_chain.check_lean_chain,
                                _own(nb02_lean_chain.solution_lean_chain)),
    "04 check_grid_us": (kernels.check_grid_us, _own(kernels.solution_grid_us)),
    "08 classify check_classify": (debugging.check_classify, _own(debugging.solution_classify)),
    "09 ex1 check_rope_copies": (in_a_model.check_rope_copies,
                                 _own(in_a_model.solution_rope_copies)),
    "06 ex3 check_rope_backward": (
        lambda fn: kernels.check_rope_backward(fn, kernel=_backward_tests.OWN_BACKWARD),
        lambda: _backward_tests.own_rope_backward),
}

SIDE_CASES = [(c, s) for c in FUNCTION_CHECKS for s in SIDE_CALLS]


@pytest.mark.parametrize("check", list(FUNCTION_CHECKS))
def test_the_learners_own_function_passes(check, capsys):
    fn, own = FUNCTION_CHECKS[check]
    assert fn(own()) is True, capsys.readouterr().out
    assert "❌" not in capsys.readouterr().out


def _blank(*args, **kwargs):
    ...  # your code


@pytest.mark.parametrize("check", list(FUNCTION_CHECKS))
def test_a_blank_answer_is_a_cross_not_an_error(check, capsys):
    fn, _ = FUNCTION_CHECKS[check]
    assert fn(_blank) is False                       # no exception, no ✅
    out = capsys.readouterr().out
    assert out.startswith("❌") and "✅" not in out and "returned None" in out, out


@pytest.mark.parametrize("check, side", SIDE_CASES, ids=[f"{c}: {s}" for c, s in SIDE_CASES])
def test_right_values_after_a_call_into_ropelib_are_refused(check, side, capsys):
    fn, own = FUNCTION_CHECKS[check]
    call, words = SIDE_CALLS[side]
    assert fn(_after(call, own())) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out and words in out, out
    assert "write it yourself" in out, out


# --- direct library answers the per-notebook tests do not try ----------------------------------

def _score_from_matrices(matrix):
    """q^T matrix(n - m) k: the score from a rotation matrix instead of the complex pairs."""
    def answer(q, k, offset, inv):
        return q @ matrix(offset, inv) @ k
    return answer


def _score_from_apply_rope(q, k, offset, inv):
    """q . (k rotated by ropelib.apply_rope to the offset n - m)."""
    R = 2 * inv.numel()
    table = (offset * inv).float().repeat_interleave(2).view(1, 1, 1, R)
    turned = ropelib.apply_rope(k.float().view(1, 1, 1, R), table, interleaved=True)
    return q @ turned.double().view(-1)


def _backward_matrix_by_autograd(theta):
    """J^T by autograd through ropelib.reference."""
    f = torch.full((1, 1, 1, 2), float(theta), dtype=torch.float64)
    J = torch.autograd.functional.jacobian(
        lambda v: reference.rope_reference(v.view(1, 1, 1, 2), f).view(2),
        torch.zeros(2, dtype=torch.float64))
    return J.T


def _backward_matrix_by_apply_rope(theta):
    """J^T read off ropelib.apply_rope of the basis vectors (RoPE is linear)."""
    f = torch.full((1, 1, 1, 2), float(theta), dtype=torch.float32)
    cols = [ropelib.apply_rope(e.view(1, 1, 1, 2), f).view(2) for e in torch.eye(2)]
    return torch.stack(cols, dim=1).T.double()


DIRECT = [
    ("01 ex2 worked solution", basics.check_relative_score, basics.solution_relative_score,
     "called ropelib's solution_relative_score"),
    ("01 ex2 wrapped worked solution", basics.check_relative_score,
     lambda q, k, o, inv: basics.solution_relative_score(q, k, o, inv),
     "called ropelib's solution_relative_score"),
    ("01 ex2 from notebook 01's worked rotation matrix", basics.check_relative_score,
     _score_from_matrices(basics.solution_rotation_matrix),
     "called ropelib's solution_rotation_matrix"),
    ("01 ex2 from the check's own matrix", basics.check_relative_score,
     _score_from_matrices(basics.rotation_matrix_ref), "called ropelib's rotation_matrix_ref"),
    ("01 ex2 from ropelib.apply_rope", basics.check_relative_score, _score_from_apply_rope,
     "called ropelib's apply_rope"),
    ("01 ex1 wrapped worked solution", basics.check_rotation_matrix,
     lambda m, inv: basics.solution_rotation_matrix(m, inv),
     "ropelib's solution_rotation_matrix"),
    ("01 ex3 wrapped worked solution", basics.check_rotate_half,
     lambda x, i: basics.solution_rotate_half(x, i), "called ropelib's solution_rotate_half"),
    ("03 ex1 wrapped worked solution", kernels.check_naive_grid,
     lambda S, B, H: kernels.solution_naive_grid(S, B, H), "called ropelib's solution_naive_grid"),
    ("03 ex2 wrapped worked solution", kernels.check_row_index,
     lambda r, S, B, H: kernels.solution_row_index(r, S, B, H),
     "called ropelib's solution_row_index"),
    ("06 ex1 autograd through ropelib.reference", kernels.check_backward_matrix,
     _backward_matrix_by_autograd, "called ropelib's rope_reference"),
    ("06 ex1 ropelib.apply_rope of the basis", kernels.check_backward_matrix,
     _backward_matrix_by_apply_rope, "called ropelib's apply_rope"),
    ("06 ex1 wrapped worked solution", kernels.check_backward_matrix,
     lambda t: kernels.solution_backward_matrix(t), "called ropelib's solution_backward_matrix"),
    ("11 ex1 ropelib.reference.positions", at_scale.check_dual_chunk_positions,
     lambda S, c, r: reference.positions("sbhd", S // c, 1, cp_size=c, cp_rank=r)[0].tolist(),
     "called ropelib's positions (ropelib/reference.py)"),
]


@pytest.mark.parametrize("label, check, answer, words", DIRECT, ids=[d[0] for d in DIRECT])
def test_a_library_answer_is_refused(label, check, answer, words, capsys):
    assert check(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out and words in out, out



def _cached_via_the_course_model(attn, x, past_k, past_v):
    """Notebook 09, exercise 2, answered by the course model's own cached attention
    (`_attention_cached`, which `forward_cached` runs) on a KVCache holding past_k, past_v."""
    from types import SimpleNamespace
    from ropelib.course import model as gpt
    B, L, H, D = past_k.shape
    S = x.shape[1]
    cache = gpt.KVCache(SimpleNamespace(n_head=H, head_dim=D, n_layer=1), B, L + S,
                        dtype=past_k.dtype, device=x.device)
    cache.k[0][:, :L], cache.v[0][:, :L] = past_k, past_v
    cache.seqlens.fill_(L)
    cache.length = L
    y = gpt._attention_cached(attn, x, cache, 0, fused=False)
    return y, cache.k[0][:, :L + S], cache.v[0][:, :L + S]


def test_cached_attention_by_the_course_model_is_refused(capsys):
    from ropelib.course.exercises import in_a_model
    assert in_a_model.check_cached_attention(_cached_via_the_course_model, seed=1) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer called ropelib's" in out, out


# --- answers that go round the watch ------------------------------------------------------------

def _in_a_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) run in a thread of its own, its result (or what it raised) handed
    back."""
    out, raised = [], []

    def work():
        try:
            out.append(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 -- raised again in the caller's thread
            raised.append(exc)
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if raised:
        raise raised[0]
    return out[0]


THREADED = [
    ("00 ex3 ropelib.reference.rope_reference", basics.check_interleaved_rope,
     lambda x, f: _in_a_thread(reference.rope_reference, x, f, layout="bshd",
                               interleaved=True)),
    ("01 ex3 the worked solution", basics.check_rotate_half,
     lambda x, i: _in_a_thread(basics.solution_rotate_half, x, i)),
    ("11 ex1 ropelib.context_parallel", at_scale.check_dual_chunk_positions,
     lambda S, c, r: _in_a_thread(context_parallel.dual_chunk_positions, S // c, c,
                                  r).tolist()),
]


@pytest.mark.parametrize("label, check, answer", THREADED, ids=[t[0] for t in THREADED])
def test_a_library_call_in_another_thread_is_refused(label, check, answer, capsys):
    assert check(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer called" in out, out


def test_the_learners_own_code_in_another_thread_passes(capsys):
    # the control: a thread of the answer's own is watched, not refused
    own = learner_copy(basics.solution_rotate_half)
    assert basics.check_rotate_half(lambda x, i: _in_a_thread(own, x, i)), \
        capsys.readouterr().out


def test_a_library_launch_in_another_thread_is_refused(capsys):
    # the same answer through ropelib.apply_rope: refused at the call (or, failing that, at its
    # kernel's launch, which is watched in every thread)
    answer = lambda x, f: _in_a_thread(ropelib.apply_rope, x, f, layout="bshd",  # noqa: E731
                                       interleaved=True)
    assert basics.check_interleaved_rope(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and ("called ropelib's" in out or "launched ropelib's" in out), out


def _profile_off(fn):
    def answer(*args):
        sys.setprofile(None)          # the check's watcher, switched off by the answer
        return fn(*args)
    return answer


def test_an_answer_that_switches_the_watcher_off_is_refused(capsys):
    assert basics.check_rotate_half(_profile_off(reference.rotate_half)) is False
    out = capsys.readouterr().out
    assert "❌" in out and "switched off the check's watch" in out, out
    assert sys.getprofile() is None         # and the check leaves the profiler as it found it


def _watch_off_and_on(fn):
    def answer(*args):
        watcher = sys.getprofile()
        sys.setprofile(None)          # off for the library's call, then back on
        try:
            return fn(*args)
        finally:
            sys.setprofile(watcher)
    return answer


def _new_threads_unwatched(fn):
    def answer(*args):
        watcher = threading.getprofile()
        threading.setprofile(None)    # a thread started now is not watched; then back on
        try:
            return _in_a_thread(fn, *args)
        finally:
            threading.setprofile(watcher)
    return answer


@pytest.mark.parametrize("answer", [_watch_off_and_on(reference.rotate_half),
                                    _new_threads_unwatched(reference.rotate_half)],
                         ids=["sys.setprofile", "threading.setprofile"])
def test_an_answer_that_switches_the_watcher_off_and_on_again_is_refused(answer, capsys):
    assert basics.check_rotate_half(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "switched off the check's watch" in out, out
    assert sys.getprofile() is None and threading.getprofile() is None


def _trap_from_the_checks_cases(pos):
    """Notebook 08's trap read off the check's own cases (debugging._trap_outputs, cached):
    the case whose output has pos's shape, its positions read by the course's tool."""
    from ropelib.course import debug
    for _, (x_case, y_case, layout), trap in debugging._trap_outputs():
        if torch.equal(debug.recovered_positions(x_case, y_case, layout), pos):
            return trap
    return "none"


def test_the_trap_read_off_the_checks_own_answers_is_refused(capsys):
    assert debugging.check_trap_name(_trap_from_the_checks_cases) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer called" in out, out



# --- answers that hand the work to another process ---------------------------------------------
# (no process of the answer's is watched: starting one, or handing one work, is refused)

_ROTATE = learner_copy(basics.solution_rotate_half)     # the learner's own, for the right values


def _in_a_process_pool(x, interleaved):
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        return pool.submit(reference.rotate_half, x, interleaved).result()


def _in_a_multiprocessing_pool(x, interleaved):
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(reference.rotate_half, (x, interleaved))


def _in_a_process(x, interleaved):
    worker = multiprocessing.get_context("fork").Process(target=reference.rotate_half,
                                                         args=(x, interleaved))
    worker.start()
    worker.join()
    return _ROTATE(x, interleaved)


def _in_python_by_subprocess(x, interleaved):
    # the library's answer computed by another Python, handed back as text
    code = ("import sys, torch, ropelib.reference as r; "
            "x = torch.tensor(eval(sys.argv[1]), dtype=torch.float64); "
            "print(r.rotate_half(x, sys.argv[2] == 'True').tolist())")
    out = subprocess.run([sys.executable, "-c", code, repr(x.tolist()), str(interleaved)],
                         capture_output=True, text=True, check=True).stdout
    return torch.tensor(eval(out), dtype=x.dtype)  # noqa: S307 -- the test's own output


def _by_os_system(x, interleaved):
    os.system(f"{sys.executable} -c pass")    # noqa: S605 -- refused before it runs
    return _ROTATE(x, interleaved)


def _by_fork(x, interleaved):
    pid = os.fork()
    if pid == 0:                               # (never reached: the fork is refused)
        os._exit(0)
    os.waitpid(pid, 0)
    return _ROTATE(x, interleaved)


def _from_a_thread_of_its_own(x, interleaved):
    return _in_a_thread(_in_python_by_subprocess, x, interleaved)


def _refusal_swallowed(x, interleaved):
    try:
        return _in_a_process_pool(x, interleaved)
    except Exception:  # noqa: BLE001 -- the answer hides the refusal and computes it itself
        return _ROTATE(x, interleaved)


PROCESSES = [
    ("a ProcessPoolExecutor", _in_a_process_pool, "ProcessPoolExecutor.submit"),
    ("a multiprocessing pool", _in_a_multiprocessing_pool, "multiprocessing's Process.start"),
    ("a multiprocessing Process", _in_a_process, "multiprocessing's Process.start"),
    ("another Python by subprocess", _in_python_by_subprocess, "subprocess.Popen"),
    ("os.system", _by_os_system, "os.system"),
    ("os.fork", _by_fork, "os.fork"),
    ("a subprocess from a thread the answer starts", _from_a_thread_of_its_own,
     "subprocess.Popen"),
    ("a refused pool, the refusal caught", _refusal_swallowed, "ProcessPoolExecutor.submit"),
]


def _entry_points():
    import _posixsubprocess
    return (multiprocessing.process.BaseProcess.start, subprocess.Popen._execute_child,
            subprocess._fork_exec, _posixsubprocess.fork_exec, os.fork, os.system,
            os.posix_spawn, concurrent.futures.ProcessPoolExecutor.submit,
            multiprocessing.pool.Pool.apply_async)


@pytest.mark.parametrize("label, answer, words", PROCESSES, ids=[p[0] for p in PROCESSES])
def test_an_answer_that_hands_the_work_to_another_process_is_refused(label, answer, words,
                                                                    capsys):
    before = _entry_points()
    assert basics.check_rotate_half(answer) is False
    out = capsys.readouterr().out
    assert "❌" in out and "but the answer" in out and "another process" in out, out
    assert f"({words})" in out and "write it yourself" in out, out
    assert _entry_points() == before         # every entry point put back as it was
    assert not multiprocessing.active_children()


def test_a_pool_started_before_the_check_is_refused(capsys):
    # its workers run before the answer does: handing them the work is what is refused
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("fork")) as pool:
        assert pool.submit(abs, -1).result() == 1
        answer = lambda x, i: pool.submit(reference.rotate_half, x, i).result()  # noqa: E731
        assert basics.check_rotate_half(answer) is False
        out = capsys.readouterr().out
        assert "handed work to another process (ProcessPoolExecutor.submit)" in out, out
        assert pool.submit(abs, -2).result() == 2       # after the check: as it was


def test_processes_start_as_usual_outside_a_check(capsys):
    assert basics.check_rotate_half(learner_copy(basics.solution_rotate_half)) is True
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_a_thread_pool_started_before_the_check_is_watched(capsys):
    # its threads started before the answer ran, so threading.setprofile never reached them:
    # the work the answer hands them runs under its watch
    from multiprocessing.pool import ThreadPool
    own = learner_copy(basics.solution_rotate_half)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, ThreadPool(1) as mp_pool:
        assert pool.submit(abs, -1).result() == 1 and mp_pool.apply(abs, (-1,)) == 1
        for answer in (lambda x, i: pool.submit(reference.rotate_half, x, i).result(),
                       lambda x, i: mp_pool.apply(reference.rotate_half, (x, i)),
                       lambda x, i: mp_pool.map(lambda t: reference.rotate_half(t, i), [x])[0]):
            assert basics.check_rotate_half(answer) is False
            out = capsys.readouterr().out
            assert "but the answer called ropelib's rotate_half" in out, out
        # the learner's own code through the same pools passes
        assert basics.check_rotate_half(lambda x, i: pool.submit(own, x, i).result())
        assert basics.check_rotate_half(lambda x, i: mp_pool.apply(own, (x, i)))
        assert "❌" not in capsys.readouterr().out


def test_a_library_call_in_a_low_level_thread_is_refused(capsys):
    import _thread

    def answer(x, interleaved):
        out, done = [], threading.Event()

        def work():
            try:
                out.append(reference.rotate_half(x, interleaved))
            except Exception:  # noqa: BLE001 -- the refusal, hidden by the answer
                out.append(learner_copy(basics.solution_rotate_half)(x, interleaved))
            finally:
                done.set()
        _thread.start_new_thread(work, ())
        done.wait(60)
        return out[0] if out else None
    assert basics.check_rotate_half(answer) is False
    out = capsys.readouterr().out
    assert "but the answer called ropelib's rotate_half" in out, out

def test_a_compiler_may_start_a_process_while_the_answer_runs():
    """Triton's compiler runs ptxas, Inductor its compile workers: a process started by their
    code is let through, the same code in a learner's file refused."""
    from ropelib.course.exercises.own_code import LibraryAnswer, library_barred
    source = ("import subprocess, sys\n"
              "def start():\n"
              "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n")
    compiler = Path(triton.__file__).resolve().parent / "backends" / "ptxas_stand_in.py"
    for filename, refused in ((str(compiler), False), (str(_COPIES / "learner_start.py"), True)):
        namespace = {}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 -- the test's own source
        if refused:
            with pytest.raises(LibraryAnswer, match=r"started another process \(subprocess"):
                with library_barred("your own code"):
                    namespace["start"]()
        else:
            with library_barred("your own code"):
                namespace["start"]()


# --- answers computed beforehand: the library's results for the check's inputs, in a table ------
# (inputs recorded from a run of the check; each check adds a case drawn when it runs)

def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _precomputed(check, own, library):
    """An answer that returns `library`'s results for the inputs of an earlier run of `check`
    (recorded while the learner's own `own` answered), computed outside any check."""
    seen = []

    def recording(*args):
        seen.append(tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
        return own(*args)
    assert check(recording) is True                     # the recording run passes
    table = [(args, library(*args)) for args in seen]    # the library's results, outside it

    def answer(*args):
        for known, result in table:
            if _same(known, args):
                return result
        return None                                      # an input it has not seen
    return answer


def _rope_bshd(x, f):
    return ropelib.apply_rope(x, f, layout="bshd", interleaved=True)


PRECOMPUTED = [
    ("00 ex3 check_interleaved_rope", basics.check_interleaved_rope,
     basics.solution_interleaved_rope, _rope_bshd),
    ("01 ex3 check_rotate_half", basics.check_rotate_half, basics.solution_rotate_half,
     reference.rotate_half),
    ("02 check_cp_positions", basics.check_cp_positions, basics.solution_cp_positions,
     lambda n, c, r: reference.positions("sbhd", n, 1, cp_size=c, cp_rank=r)[0]),
    ("02 ex2 check_cos_sin_from_freqs", basics.check_cos_sin_from_freqs,
     basics.solution_cos_sin_from_freqs, basics.solution_cos_sin_from_freqs),
    ("02 check_bytes_moved", basics.check_bytes_moved, basics.solution_bytes_moved,
     basics.solution_bytes_moved),
    ("03 ex1 check_naive_grid", kernels.check_naive_grid, kernels.solution_naive_grid,
     lambda S, B, H: tuple(naive.naive_grid(S, B, H))),
    ("03 ex2 check_row_index", kernels.check_row_index, kernels.solution_row_index,
     kernels.solution_row_index),
    ("03 ex3 check_half_tile", kernels.check_half_tile, kernels.solution_half_tile,
     kernels.solution_half_tile),
    ("04 ex1 check_angle_bytes", kernels.check_angle_bytes, kernels.solution_angle_bytes,
     kernels.solution_angle_bytes),
    ("04 ex2 check_floor_ms", kernels.check_floor_ms, kernels.solution_floor_ms,
     kernels.solution_floor_ms),
    ("04 ex3 check_percent_of_copy", kernels.check_percent_of_copy,
     kernels.solution_percent_of_copy, kernels.solution_percent_of_copy),
    ("06 ex1 check_backward_matrix", kernels.check_backward_matrix,
     kernels.solution_backward_matrix, _backward_matrix_by_apply_rope),
    ("10 ex1 check_axis_of_pairs", multi_axis.check_axis_of_pairs,
     multi_axis.solution_axis_of_pairs,
     lambda s, i: mrope.axis_of_pairs(s, "mrope_interleaved" if i else "mrope").long()),
    ("10 ex2 check_text_then_image", multi_axis.check_text_then_image,
     multi_axis.solution_text_then_image, multi_axis.solution_text_then_image),
    ("11 ex1 check_dual_chunk_positions", at_scale.check_dual_chunk_positions,
     at_scale.solution_dual_chunk_positions,
     lambda S, n, r: context_parallel.dual_chunk_positions(S // n, n, r)),
    ("11 ex3 check_paged_slot", at_scale.check_paged_slot, at_scale.solution_paged_slot,
     at_scale.solution_paged_slot),
    ("08 check_normwise_error", debugging.check_normwise_error,
     debugging.solution_normwise_error, debugging.solution_normwise_error),
    ("07 ex1 check_fit_time_model", measuring.check_fit_time_model,
     measuring.solution_fit_time_model, measuring.solution_fit_time_model),
]


@pytest.mark.parametrize("label, check, solution, library", PRECOMPUTED,
                         ids=[p[0] for p in PRECOMPUTED])
def test_library_results_computed_before_the_check_fail_at_its_drawn_case(label, check, solution,
                                                                          library, capsys):
    # (a draw may, rarely, repeat an input the table holds: three tables, three draws)
    for _ in range(3):
        answer = _precomputed(check, learner_copy(solution), library)
        capsys.readouterr()
        if not check(answer):
            break
    out = capsys.readouterr().out
    # every case but the one drawn as the check runs matches the table: that one fails
    failed = [line for line in out.splitlines() if line.startswith("❌")]
    assert failed and "drawn with seed " in failed[0], out


# --- kernel answers: a kernel of the learner's whose body calls the worked one -----------------

_COPIES = scratch_folder("ropelib-refuse-")
_count = itertools.count()


def wrapping(target, *, returns=False, extra=()):
    """A @triton.jit kernel of the learner's, in a file of its own, with `target`'s parameters
    (names, annotations, defaults) and the constexprs named in `extra` after them, whose body
    only calls `target` with its own parameters."""
    fn = getattr(target, "fn", target)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    name = f"my_{fn.__name__.strip('_')}_{next(_count)}"
    node.name = name
    node.decorator_list = []
    call = ast.Call(func=ast.Name("TARGET", ast.Load()),
                    args=[ast.Name(a.arg, ast.Load()) for a in node.args.args], keywords=[])
    constexpr = ast.Attribute(ast.Name("tl", ast.Load()), "constexpr", ast.Load())
    node.args.args += [ast.arg(e, constexpr) for e in extra]
    node.body = [ast.Return(call) if returns else ast.Expr(call)]
    node.returns = None
    source = "@triton.jit\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return getattr(written_module(name, _COPIES / f"{name}.py", source,
                                  {"triton": triton, "tl": tl, "TARGET": target}), name)


def _granular_work(S, B, H, D, rows):
    programs = (B // rows) * H * S
    return {"programs": programs, "x_loads": S * B * H * D, "sincos": programs * 2 * D,
            "angle_loads": programs * D}


KERNEL_CHECKS = [
    ("03 ex4 check_rope_interleaved", naive_kernel.check_rope_interleaved,
     naive_kernel.solution_rope_interleaved),
    ("03 ex5 check_rope_rows", naive_kernel.check_rope_rows, naive_kernel.solution_rope_rows),
    ("04 ex4 check_batch_reuse_kernel", grid_kernel.check_batch_reuse_kernel,
     grid_kernel._rope_batch_reuse_solution_kernel),
    ("04 ex5 check_granularity", lambda k: grid_kernel.check_granularity(k, _granular_work),
     grid_kernel._rope_granular_solution_kernel),
    ("05 ex1 check_interleaved_tile_kernel", finished_kernel.check_interleaved_tile_kernel,
     finished_kernel._rope_interleaved_tile_solution_kernel),
    ("05 ex2 check_flat_kernel", flat_pass.check_flat_kernel,
     flat_pass._rope_flat_solution_kernel),
    ("05 ex3 check_pairs_kernel", pairs_pass.check_pairs_kernel,
     pairs_pass._rope_pairs_solution_kernel),
    ("06 ex2 check_backward_kernel", backward_kernel.check_backward_kernel,
     backward_kernel._rope_backward_solution_kernel),
    ("07 ex3 check_rows_kernel", yardstick.check_rows_kernel, yardstick.solution_rows_kernel),
    ("09 ex3 check_model_rope_kernel", in_a_model.check_model_rope_kernel,
     in_a_model.solution_model_rope_kernel),
    ("08 repair check_sbhd_repair", nb08_repair.check_sbhd_repair,
     nb08_repair.solution_sbhd_kernel),
    ("10 kernel exercise check_mrope_kernel", multi_axis.check_mrope_kernel,
     multi_axis.solution_mrope_kernel),
    ("11 ex1b check_cp_shard_kernel", nb11_cp_shard.check_cp_shard_kernel,
     nb11_cp_shard.solution_cp_shard_kernel),
    ("11 ex2 check_rope_kv_cache_kernel", at_scale.check_rope_kv_cache_kernel,
     at_scale.solution_rope_kv_cache_kernel),
    ("11 ex4 check_rope_kv_paged_kernel", at_scale.check_rope_kv_paged_kernel,
     at_scale.solution_rope_kv_paged_kernel),
    ("11 ex5 check_fp8_store_kernel", at_scale.check_fp8_store_kernel,
     at_scale.solution_fp8_store_kernel),
    ("10 ex4 check_mrope_heads_kernel", multi_axis.check_mrope_heads_kernel,
     multi_axis.solution_mrope_heads_kernel),
    ("12 ex1 check_epilogue_kernel", lambda k: qkv_epilogue.check_epilogue_kernel(k, seed=5),
     qkv_teaching._qkv_rope_teaching_kernel),
    ("12 ex1b check_split_epilogue_kernel",
     lambda k: qkv_epilogue.check_split_epilogue_kernel(k, seed=5),
     qkv_teaching._qkv_rope_one_acc_teaching_kernel),
    ("12 ex2 check_prologue_kernel", lambda k: qkv_epilogue.check_prologue_kernel(k, seed=5),
     qkv_teaching._qkv_dx_teaching_kernel),
    ("00 ex4 check_strided_copy", nb00_strided_copy.check_strided_copy,
     nb00_strided_copy.solution_strided_copy_kernel),
    ("01 ex5 check_angle_kernel", lambda k: nb01_angle_kernel.check_angle_kernel(k, seed=0),
     nb01_angle_kernel.solution_angle_kernel),
    ("02 ex5 check_table_mul", nb02_table_mul.check_table_mul,
     nb02_table_mul._table_mul_solution_kernel),
    ("04 ex6 check_two_rows", nb04_two_rows.check_two_rows,
     nb04_two_rows._rope_two_rows_solution_kernel),
    ("06 check_interleaved_backward", nb06_interleaved.check_interleaved_backward,
     nb06_interleaved._rope_interleaved_backward_solution_kernel),
    ("09 ex4 check_one_angle_kernel", lambda k: nb09_one_angle.check_one_angle_kernel(k, seed=0),
     in_a_model.solution_model_rope_one_angle),
    # exercise 1b grades the loads (then the stores) of a kernel that passes exercise 1's check,
    # whose worked solution is exercise 1b's too
    ("05 ex1b check_wide_loads",
     lambda k: load_schedule.check_wide_loads("1b", k, {}, num_warps=8, wide=2,
                                              check=finished_kernel.check_interleaved_tile_kernel),
     finished_kernel._rope_interleaved_tile_solution_kernel),
]
# notebook 12, exercise 3: the teaching kernel's signature and a last constexpr PROGRAMS
_PERSISTENT = ("12 ex3 check_persistent_kernel",
               lambda k: qkv_epilogue.check_persistent_kernel(k, seed=5),
               qkv_teaching._qkv_rope_teaching_kernel)


@pytest.mark.parametrize("label, check, target", [_PERSISTENT], ids=[_PERSISTENT[0]])
def test_a_persistent_kernel_that_calls_the_teaching_kernel_is_refused(label, check, target,
                                                                       capsys):
    assert check(wrapping(target, extra=("PROGRAMS",))) is False
    out = capsys.readouterr().out
    assert "❌" in out and f"ropelib's {target.fn.__name__}" in out, out
    assert "write it yourself" in out, out


KERNEL_CHECKS += [(f"13 puzzle {p.number} check_{key}",
                   (lambda key: lambda k: getattr(pz, f"check_{key}")(k, seed=0, draw=False))(key),
                   p.solution)
                  for key, p in pz.PUZZLES.items()]


@pytest.mark.parametrize("label, check, target", KERNEL_CHECKS, ids=[k[0] for k in KERNEL_CHECKS])
def test_a_kernel_that_calls_the_worked_kernel_is_refused(label, check, target, capsys):
    kernel = wrapping(target)
    assert check(kernel) is False
    out = capsys.readouterr().out
    name = getattr(target, "fn", target).__name__
    assert "❌" in out and f"ropelib's {name}" in out, out
    assert "write it yourself" in out, out


def test_a_combine_that_calls_the_worked_combine_is_refused(capsys):
    # notebook 08, exercise 2: the check launches its own kernel with the learner's combine
    combine = wrapping(debugging.solution_te_combine, returns=True)
    assert debugging.check_te_combine(combine) is False
    out = capsys.readouterr().out
    assert "❌" in out and "ropelib's solution_te_combine" in out, out


def test_a_wrapper_of_an_own_kernel_is_not_refused(capsys):
    """The wrapping itself is no reason to refuse: the same wrapper around the learner's own
    copy of the worked solution passes, so the refusals above are the worked kernel's."""
    own = learner_copy(naive_kernel.solution_rope_interleaved)
    assert naive_kernel.check_rope_interleaved(wrapping(own)) is True, capsys.readouterr().out
    assert "❌" not in capsys.readouterr().out

