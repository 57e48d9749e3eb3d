"""When maintain's re-drive of stuck drawers waits for the pipeline's backlog (shared.lifecycle)."""

from shared.lifecycle import backlog_defers_redrive

STUCK = 300.0  # PALACE_STUCK_AFTER_S's default


def test_no_backlog_never_defers() -> None:
    assert not backlog_defers_redrive(0, 0.0, STUCK)


def test_a_backlog_holding_messages_as_old_as_a_stuck_drawer_defers() -> None:
    """A stuck drawer's event may still be queued: re-driving would double the work behind the same queue."""
    assert backlog_defers_redrive(5_000, STUCK, STUCK)
    assert backlog_defers_redrive(1, 3_600.0, STUCK)


def test_a_backlog_of_only_younger_messages_does_not_defer() -> None:
    """A palace ingesting without pause always has a few messages in flight: they cannot hold a drawer whose
    last event is older than all of them, so the re-drive runs (before, any backlog deferred it for ever)."""
    assert not backlog_defers_redrive(12, 2.5, STUCK)
    assert not backlog_defers_redrive(40_000, STUCK - 1, STUCK)
