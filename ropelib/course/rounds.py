"""Two variants timed in the same rounds, compared round by round: the per-round ratio, who won
each round and the sign test (notebooks 09 and 12 read their rounds with it)."""
import math
import statistics


def paired_rounds(times_a, times_b) -> dict:
    """Two variants timed once in each of the same rounds, compared round by round.

    ``times_a[i]`` and ``times_b[i]`` are the times (ms) of variants a and b in round i. Returns
    ``ratio`` (the median over the rounds of t_a / t_b: below 1, a was faster), ``low`` and
    ``high`` (the least and most of those ratios), ``a_wins`` and ``b_wins`` (the rounds in which
    each was the faster; a tie counts for neither), ``rounds``, and ``p``: the two-sided sign test
    of "each is as likely to win a round", p = 2 * sum_{j >= k} C(n, j) / 2^n, with n the rounds
    that were not ties and k the larger win count (capped at 1; 1 when n is 0).
    """
    a, b = [float(t) for t in times_a], [float(t) for t in times_b]
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number (> 0) of rounds for both, got {len(a)} and {len(b)}")
    ratios = [x / y for x, y in zip(a, b)]
    a_wins = sum(x < y for x, y in zip(a, b))
    b_wins = sum(x > y for x, y in zip(a, b))
    n, k = a_wins + b_wins, max(a_wins, b_wins)
    p = min(1.0, 2 * sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n) if n else 1.0
    return dict(ratio=statistics.median(ratios), low=min(ratios), high=max(ratios),
                a_wins=a_wins, b_wins=b_wins, rounds=len(a), p=p)

