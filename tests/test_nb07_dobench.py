"""ropelib.course.nb07_dobench: notebook 07's lines on do_bench's loop, on the CPU."""
from ropelib.course import nb07_dobench as nb


def test_back_to_back_is_the_slower_side_or_the_wall_clock():
    assert nb.back_to_back_us({"enqueue_us": 30.0, "replay_us": 50.0, "wall_us": 9.0}) == 50.0
    assert nb.back_to_back_us({"enqueue_us": 60.0, "replay_us": 50.0, "wall_us": 9.0}) == 60.0
    assert nb.back_to_back_us({"enqueue_us": 60.0, "replay_us": None, "wall_us": 9.0}) == 9.0


def test_issue_line_names_the_side_that_sets_the_pace():
    line = lambda enq, rep: nb.issue_line("x", {"enqueue_us": enq, "replay_us": rep,
                                                "wall_us": 1.0}, 42.0)
    assert "host-bound" in line(80.0, 50.0) and "device-bound" in line(20.0, 50.0)
    assert "level" in line(51.0, 50.0) and line(1.0, 2.0).endswith("do_bench   42.0 us")
    assert "wall" in line(5.0, None)


def test_regime_line_on_the_two_cases_of_the_picture():
    slow_host = {"iter_host": 300.0, "to_start_host": 40.0, "to_call_host": 290.0,
                 "events": 120.0}
    assert "device waits" in nb.regime_line("a", slow_host, 60.0, 50.0, 110.0)
    ahead = nb.regime_line("a", {**slow_host, "iter_host": 80.0, "events": 50.0}, 60.0, 50.0, 50.0)
    assert "host ahead" in ahead and ahead.endswith("(+0%): agree (within 20%)")
    assert nb.regime_line("a", slow_host, 60.0, 50.0, 40.0).endswith(
        "(+200%): differ (by more than 20%)")
    # 18 % apart (an H100 run's TE line): agree, and the line says by how much and within what
    near = nb.regime_line("a", {**slow_host, "events": 157.5}, 60.0, 50.0, 133.6)
    assert near.endswith("do_bench 133.6 us (+18%): agree (within 20%)")
