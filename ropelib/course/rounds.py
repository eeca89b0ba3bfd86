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


def pooled_rounds(pairs, level: float = 0.95) -> dict:
    """Two variants compared over the rounds of several cells taken together.

    ``pairs`` is a list of ``(times_a, times_b)``, one a cell (a size, an option), each as for
    ``paired_rounds``. Every round of every cell counts once: ``ratio`` (the median of all the
    rounds' t_a / t_b), ``a_wins``, ``b_wins``, ``rounds`` and the two-sided sign test ``p`` over
    them all (under "each is as likely to win a round" the pooled wins are binomial, whatever the
    cells' own medians), and ``ci``: a distribution-free interval for the median ratio, the
    k-th least and k-th most of the n ratios, k the largest rank whose coverage,
    ``1 - 2 P(Binomial(n, 1/2) < k)`` (returned as ``coverage``), is at least ``level``.
    ``resolved`` is the page's one rule: ``p < 1 - level`` and ``ci`` does not contain 1.
    """
    a = [float(t) for ta, _ in pairs for t in ta]
    b = [float(t) for _, tb in pairs for t in tb]
    if any(len(ta) != len(tb) for ta, tb in pairs) or not a:
        raise ValueError("need the same number (> 0) of rounds for both variants in every cell")
    out = paired_rounds(a, b)
    ratios = sorted(x / y for x, y in zip(a, b))
    n = len(ratios)

    def below(k):                         # P(Binomial(n, 1/2) < k)
        return sum(math.comb(n, j) for j in range(k)) / 2**n

    k = 1
    while k < n // 2 and 1 - 2 * below(k + 1) >= level:
        k += 1
    coverage = 1 - 2 * below(k)
    ci = (ratios[k - 1], ratios[n - k])
    resolved = out["p"] < 1 - level and not ci[0] <= 1.0 <= ci[1] and coverage >= level
    return dict(out, ci=ci, coverage=coverage, resolved=resolved)


def correlation(x, y) -> float:
    """Pearson's correlation of two variants' times over the same rounds (`statistics.correlation`;
    0 where either did not vary): pairing by round removes scatter only where it is high (the two
    moved together from round to round)."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    if len(x) != len(y):
        raise ValueError(f"need the same rounds for both, got {len(x)} and {len(y)}")
    if len(set(x)) < 2 or len(set(y)) < 2:
        return 0.0
    return statistics.correlation(x, y)


def holm(p_values) -> list:
    """Holm's step-down adjustment of several p-values tested together (a family of comparisons).

    Sort the m p-values from least to most, p_(1) <= ... <= p_(m); the i-th gets
    ``max over j <= i of min(1, (m - j + 1) p_(j))``. Returned in the order given. Calling a
    comparison resolved when its adjusted p is below 0.05 keeps the chance of *any* false call
    among the m at most 0.05, whatever the comparisons' dependence (Holm, 1979); each unadjusted
    p below 0.05 would keep only each one's own chance there.
    """
    p = [float(v) for v in p_values]
    if any(not 0.0 <= v <= 1.0 for v in p):
        raise ValueError(f"p-values lie in [0, 1], got {p}")
    m = len(p)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted
