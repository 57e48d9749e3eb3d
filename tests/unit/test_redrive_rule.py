"""When maintain re-drives stuck drawers, given the pipeline's backlog (shared.lifecycle.redrive_idle_s)."""

from shared.lifecycle import redrive_idle_s

STUCK = 300.0  # PALACE_STUCK_AFTER_S's default


def test_no_backlog_re_drives_what_has_been_idle_stuck_after() -> None:
    assert redrive_idle_s(0, 0.0, STUCK) == STUCK


def test_a_backlog_holding_messages_as_old_as_a_stuck_drawer_defers() -> None:
    """A stuck drawer's event may still be queued: re-driving would double the work behind the same queue."""
    assert redrive_idle_s(5_000, STUCK, STUCK) is None
    assert redrive_idle_s(1, 3_600.0, STUCK) is None


def test_a_backlog_of_only_younger_messages_does_not_defer() -> None:
    """A palace ingesting without pause always has a few messages in flight: they cannot hold a drawer whose
    last event is older than all of them, so the re-drive runs (before, any backlog deferred it for ever)."""
    assert redrive_idle_s(12, 2.5, STUCK) is not None
    assert redrive_idle_s(40_000, STUCK - 1, STUCK) is not None


def test_a_drawer_is_re_driven_only_once_idle_past_every_queued_message() -> None:
    """Its event is published after the commit that stamped it: a drawer embedded 301 s ago whose
    drawer.embedded has waited 2 s in classify's queue is idle past stuck_after by the clock, not past the
    oldest queued message. It waits until it is idle stuck_after longer than that message is old."""
    idle = redrive_idle_s(12, 2.5, STUCK)
    assert idle == STUCK + 2.5
    assert idle is not None and 301.0 < idle < 303.0
