"""The forced routes of ropelib.bench.routes, for the tests (`from routes import ...`: pytest puts
tests/ on the path)."""
from ropelib.bench.routes import FORCED, NAMES, forced, through, thresholds  # noqa: F401
