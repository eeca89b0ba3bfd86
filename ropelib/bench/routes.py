"""The route ropelib plans, forced, for the tests and benchmarks that compare routes: the
finished kernel at every size, or two passes at every size (kernels/tiles.py's thresholds set for
a while, and the eager route's plans forgotten on the way in and out)."""
import contextlib

from ropelib import eager
from ropelib.kernels import tiles

NAMES = ("TWO_PASS_MIN_BYTES", "TWO_PASS_TABLE_SHARE", "TWO_PASS_KEPT_TABLE_SHARE")
# route -> (min_bytes, share): "finished" never takes two passes, "two-pass" always does,
# "auto" leaves the thresholds as they are
FORCED = {"finished": (1 << 62, 0), "two-pass": (0, 0), "auto": (None, None)}


def thresholds(min_bytes=None, share=None, kept_share=None) -> tuple:
    """Set the two-pass route's size threshold and its table shares (the operators', and the
    eager route's for rows it keeps: `kept_share`, `share` unless given); None leaves one as it
    is. Returns what they were, for thresholds(*saved)."""
    saved = tuple(getattr(tiles, n) for n in NAMES)
    if kept_share is None:
        kept_share = share
    for name, value in zip(NAMES, (min_bytes, share, kept_share)):
        if value is not None:
            setattr(tiles, name, value)
    return saved


@contextlib.contextmanager
def forced(route: str):
    """Inside the block every plan takes `route` ("finished", "two-pass" or "auto")."""
    saved = thresholds(*FORCED[route])
    eager.SIGNATURES.clear()
    try:
        yield
    finally:
        thresholds(*saved)
        eager.SIGNATURES.clear()


def through(route: str, fn):
    """fn() with the route forced (see `forced`)."""
    with forced(route):
        return fn()
