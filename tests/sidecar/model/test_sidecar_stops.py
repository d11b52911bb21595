"""model/stops.py: stop strings end the text where they begin, even across pieces."""

from __future__ import annotations

from sidecar.model.stops import StopFilter


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    stop_filter = StopFilter(stops)
    shown = ""
    for piece in pieces:
        text, stopped = stop_filter.feed(piece)
        shown += text
        if stopped:
            return shown, True
    return shown + stop_filter.flush(), False


def test_a_stop_split_across_pieces_is_never_shown() -> None:
    assert run(["<END>"], ["Hello <", "E", "ND> and more"]) == ("Hello ", True)


def test_text_held_back_is_shown_when_it_is_not_a_stop() -> None:
    stop_filter = StopFilter(["<END>"])
    assert stop_filter.feed("Hello <E") == ("Hello ", False)  # "<E" might begin "<END>"
    assert stop_filter.feed("X") == ("<EX", False)
    assert run(["<END>"], ["a <E"]) == ("a <E", False)  # the reply ended: flushed


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(["world", "lo w"], ["Hello world"]) == ("Hel", True)


def test_overlapping_prefixes() -> None:
    assert run(["aab"], ["a", "a", "a", "b", "c"]) == ("a", True)
    assert run(["aab"], ["aaa", "c"]) == ("aaac", False)


def test_no_stops_pass_everything() -> None:
    stop_filter = StopFilter([])
    assert not stop_filter and stop_filter.feed("text") == ("text", False)
