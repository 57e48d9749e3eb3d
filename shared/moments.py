"""The instants Palace stores: those PostgreSQL keeps and psycopg reads back, in any time zone.

A ``timestamptz`` holds years up to 294276, but Python's ``datetime`` ends at year 9999 and starts at
year 1: an instant written near either end (``9999-12-31T23:30:00-01:00`` is year 10000 in UTC) is
stored, then every later read of its row fails. Refused where it comes in, with a clear error.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["EARLIEST", "LATEST", "time_problem"]

EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 12, 31, 23, 59, 59, tzinfo=UTC)


def time_problem(value: datetime) -> str | None:
    """Why ``value`` cannot be stored (naive: read as UTC), or None."""
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        utc = aware.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        return f"{value.isoformat()} is outside the years {EARLIEST.year}–{LATEST.year}"
    return None
