"""Time windows read from recall queries: what each kind of expression maps to."""

from datetime import UTC, datetime

from shared.memory.timeexpr import date_windows

NOW = datetime(2026, 11, 23, 15, 30, tzinfo=UTC)


def d(y: int, m: int, day: int = 1) -> datetime:
    return datetime(y, m, day, tzinfo=UTC)


def test_a_day_with_its_year_is_that_day_and_the_six_after() -> None:
    q = "What did Gina find for her store on 1 February, 2023?"
    assert date_windows(q, NOW) == [(d(2023, 2, 1), d(2023, 2, 8))]
    assert date_windows("the painting shown on October 13, 2023", NOW) == [(d(2023, 10, 13), d(2023, 10, 20))]
    assert date_windows("on the 13th of Oct 2023", NOW) == [(d(2023, 10, 13), d(2023, 10, 20))]


def test_a_month_is_the_calendar_month_and_december_rolls_into_the_next_year() -> None:
    assert date_windows("What setback did Melanie face in October 2023?", NOW) == [(d(2023, 10), d(2023, 11))]
    assert date_windows("plans for December 2022", NOW) == [(d(2022, 12), d(2023, 1))]


def test_a_date_without_a_year_covers_each_recent_year() -> None:
    windows = date_windows("When did Melanie go camping in June?", NOW, years_back=3)
    assert windows == [(d(y, 6), d(y, 7)) for y in (2023, 2024, 2025, 2026)]


def test_a_bare_year_is_that_year() -> None:
    assert date_windows("How many times has she gone to the beach in 2023?", NOW) == [(d(2023, 1), d(2024, 1))]
    assert len(date_windows("between 2020 and 2021", NOW)) == 2


def test_words_that_only_look_like_months_are_not_dates() -> None:
    assert date_windows("What may help me sleep?", NOW) == []
    assert date_windows("Did Jan mention the Mar a Lago trip?", NOW) == []
    assert date_windows("no time here at all", NOW) == []
    assert date_windows("May 2022 trip", NOW) == [(d(2022, 5), d(2022, 6))]
    assert date_windows("It was in May.", NOW)[-1] == (d(2026, 5), d(2026, 6))


def test_an_impossible_day_gives_no_window() -> None:
    assert date_windows("February 30, 2023", NOW) == []


def test_relative_words_count_back_from_now() -> None:
    assert date_windows("what did we discuss yesterday?", NOW) == [(d(2026, 11, 22), d(2026, 11, 23))]
    assert date_windows("anything today?", NOW) == [(d(2026, 11, 23), d(2026, 11, 24))]
    assert date_windows("last month", NOW) == [(d(2026, 10), d(2026, 11))]
    assert date_windows("last month", datetime(2027, 1, 5, tzinfo=UTC)) == [(d(2026, 12), d(2027, 1))]
    assert date_windows("this year", NOW) == [(d(2026, 1), d(2027, 1))]
    assert date_windows("last year", NOW) == [(d(2025, 1), d(2026, 1))]
    assert date_windows("last week", NOW) == [(d(2026, 11, 9), d(2026, 11, 23))]


def test_iso_dates_are_the_day_or_month_they_name_not_their_year() -> None:
    assert date_windows("what happened on 2023-10-13?", NOW) == [(d(2023, 10, 13), d(2023, 10, 20))]
    assert date_windows("the 2023-10 release", NOW) == [(d(2023, 10), d(2023, 11))]
    assert date_windows("on 2023-02-30", NOW) == []  # not a date, and not the whole of 2023 either
    assert date_windows("from 2023-10-13 to 2023-10-20", NOW) == [(d(2023, 10, 13), d(2023, 10, 20)),
                                                                  (d(2023, 10, 20), d(2023, 10, 27))]


def test_the_past_week_month_and_year_trail_up_to_today() -> None:
    # "last month" is the calendar's; "the past month" ends today, so the 1st to the 23rd of November count.
    assert date_windows("in the past month", NOW) == [(d(2026, 10, 24), d(2026, 11, 24))]
    assert date_windows("over the past week", NOW) == [(d(2026, 11, 17), d(2026, 11, 24))]
    assert date_windows("in the past year", NOW) == [(d(2025, 11, 23), d(2026, 11, 24))]
    assert date_windows("previous month", NOW) == [(d(2026, 10), d(2026, 11))]
