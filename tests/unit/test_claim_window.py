"""The claiming sensors' shared wait window (pipelines/claim_window.py): who opens a loop's window, who joins it."""

from pipelines.claim_window import ClaimWindow


def test_the_first_claiming_tick_of_a_loop_opens_the_window_and_the_others_share_its_deadline():
    window = ClaimWindow()
    first = window.enter("a", 100.0, 4.5)
    assert first.opened and first.deadline == 104.5
    second = window.enter("b", 100.3, 4.5)
    assert not second.opened and second.deadline == 104.5, "a later tick waits out the same window, no longer"
    assert not second.ended(100.3)


def test_a_tick_after_the_window_ended_has_nothing_to_wait_for():
    window = ClaimWindow()
    window.enter("a", 100.0, 4.5)
    late = window.enter("b", 104.6, 4.5)
    assert late.ended(104.6), "an idle loop must not grow by a second wait"


def test_a_sensor_that_ticks_again_starts_the_next_loop():
    window = ClaimWindow()
    window.enter("a", 100.0, 4.5)
    window.enter("b", 104.6, 4.5)
    again = window.enter("a", 105.0, 4.5)
    assert again.opened and again.deadline == 109.5
    assert not window.enter("b", 105.1, 4.5).opened, "b joins the new loop's window"


def test_a_stale_window_is_never_joined():
    window = ClaimWindow(stale_seconds=30.0)
    window.enter("a", 100.0, 4.5)
    late = window.enter("b", 200.0, 4.5)  # the daemon restarted, or "a" was stopped meanwhile
    assert late.opened and late.deadline == 204.5


def test_the_window_that_opened_is_never_ended_for_its_opener():
    """With no wait (KBINDEX_CLAIM_WAIT_SECONDS=0) the opener still ticks once; the others return at once."""
    window = ClaimWindow()
    first = window.enter("a", 100.0, 0.0)
    assert first.opened and not first.ended(100.0)
    assert window.enter("b", 100.0, 0.0).ended(100.0)
