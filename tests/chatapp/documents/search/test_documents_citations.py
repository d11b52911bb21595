"""Citations are checked against the passages the turn was given, never linked blindly."""

from __future__ import annotations

from chatapp.documents.search.citations import Checked, check, mark


def test_a_reply_citing_9_of_4_passages() -> None:
    reply = "Descale monthly [2]. Boil it dry at your peril [9]. See also [1, 4][3]."
    assert check(reply, 4) == Checked(cited=[2, 1, 4, 3], unknown=[9])
    assert (
        mark(reply, 4) == "Descale monthly [2]. Boil it dry at your peril [9?]. See also [1, 4][3]."
    )


def test_code_and_links_are_not_citations() -> None:
    reply = (
        "Use `a[1]` or\n```python\nx = y[2]\n```\nthen [read this](https://x) [5](https://y) [1]"
    )
    assert check(reply, 4) == Checked(cited=[1], unknown=[])
    assert mark(reply, 0) == reply.replace("[1]\n", "[1]\n").replace(" [1]", " [1?]")


def test_zero_and_repeats() -> None:
    assert check("[0] [1] [1] [0]", 3) == Checked(cited=[1], unknown=[0])
    assert check("no citations at all", 3) == Checked(cited=[], unknown=[])
