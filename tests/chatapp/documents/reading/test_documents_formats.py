"""Every format read from a real file, and every per-file refusal with its reason."""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from chatapp.documents.reading.blocks import REFUSALS, Block, Refused
from chatapp.documents.reading.formats import Limits, format_of, read
from tests.chatapp.documents import make_files

FILES = Path(__file__).parents[1] / "files"
LIMITS = Limits(max_bytes=10_000_000, max_pages=100)


def blocks_of(name: str, limits: Limits = LIMITS, mime: str | None = None) -> list[Block]:
    return read((FILES / name).read_bytes(), name, mime, limits)[1]


def refusal(name: str, limits: Limits = LIMITS, data: bytes | None = None) -> Refused:
    body = (FILES / name).read_bytes() if data is None else data
    with pytest.raises(Refused) as caught:
        read(body, name, None, limits)
    assert caught.value.code in REFUSALS
    assert caught.value.message.endswith(".")
    return caught.value


def test_text_is_paragraphs() -> None:
    assert blocks_of("guide.txt") == [
        Block("text", "The kettle boils a litre in three minutes."),
        Block("text", "Descale once a month in hard water areas\nwith citric acid."),
    ]


def test_markdown_keeps_headings_tables_and_code_blocks() -> None:
    blocks = blocks_of("guide.md")
    assert [(b.kind, b.level) for b in blocks if b.kind == "heading"] == [
        ("heading", 1),
        ("heading", 2),
        ("heading", 2),
    ]
    assert Block("table", "Setting | Temperature\nGreen tea | 80 C\nBlack tea | 100 C") in blocks
    code = [b.text for b in blocks if b.text.startswith("```")]
    assert code == ["```sh\nkettle --descale   # [1] is not a citation here\n```"]


def test_html_reads_what_a_reader_sees() -> None:
    blocks = blocks_of("guide.html")
    texts = [b.text for b in blocks]
    assert Block("heading", "Kettle manual", level=1) == blocks[0]
    assert "The kettle boils a litre in three minutes." in texts
    assert "Descale once a month in hard water areas with citric acid." in texts
    assert "Setting | Temperature\nGreen tea | 80 C\nBlack tea | 100 C" in texts
    assert "It does not cover limescale." in texts
    assert not any("secret" in t or "color" in t for t in texts)


def test_html_without_headings_takes_its_title() -> None:
    data = b"<html><head><title>Notes</title></head><body><p>One.</p></body></html>"
    assert read(data, "notes.html", None, LIMITS)[1] == [
        Block("heading", "Notes", level=1),
        Block("text", "One."),
    ]


def test_pdf_pages_and_outline() -> None:
    blocks = blocks_of("guide.pdf")
    headings = [(b.text, b.page) for b in blocks if b.kind == "heading"]
    assert headings == [("Installing the kettle", 1), ("Descaling", 2), ("Warranty", 3)]
    warranty = [b for b in blocks if b.kind == "text" and "24 months" in b.text]
    assert [b.page for b in warranty] == [3]


def test_docx_headings_paragraphs_and_tables_in_order() -> None:
    blocks = blocks_of("guide.docx")
    assert [b.kind for b in blocks] == ["heading", "heading", "text", "heading", "table", "text"]
    assert blocks[0] == Block("heading", "Kettle manual", level=0)
    assert blocks[3] == Block("heading", "Settings", level=2)
    assert blocks[4].text == "Setting | Temperature\nGreen tea | 80 C\nBlack tea | 100 C"


def test_format_from_type_or_bytes_when_the_name_says_nothing() -> None:
    pdf = (FILES / "guide.pdf").read_bytes()
    assert format_of(pdf, "upload", None) == "pdf"
    assert format_of(b"# x", "upload", "text/markdown; charset=utf-8") == "markdown"
    assert format_of(b"<!DOCTYPE html><p>x", "upload", None) == "html"
    assert format_of(b"plain words", "README", None) == "text"


def test_utf16_and_windows_1252_text() -> None:
    assert read("naïve café".encode("utf-16"), "a.txt", None, LIMITS)[1][0].text == "naïve café"
    assert read("naïve".encode("cp1252"), "a.txt", None, LIMITS)[1][0].text == "naïve"


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("scanned.pdf", "no_text"),
        ("blank.txt", "no_text"),
        ("encrypted.pdf", "encrypted"),
        ("encrypted.docx", "encrypted"),
        ("broken.pdf", "broken"),
        ("broken.docx", "broken"),
        ("image.png", "unsupported_type"),
    ],
)
def test_each_refusal_names_its_reason(name: str, code: str) -> None:
    assert refusal(name).code == code


def test_too_large_file_pages_and_unpacked_size() -> None:
    assert refusal("guide.txt", Limits(max_bytes=10, max_pages=100)).code == "too_large"
    assert "3 pages" in refusal("guide.pdf", Limits(10_000_000, max_pages=2)).message
    # A DOCX that unpacks to more than 20 times the file limit: a zip bomb's shape.
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b" " * 2_000_000)
    bomb = out.getvalue()
    assert len(bomb) < 10_000
    assert refusal("bomb.docx", Limits(20_000, 100), data=bomb).code == "too_large"


def test_a_pdf_named_docx_and_text_that_is_binary_are_broken() -> None:
    pdf = (FILES / "guide.pdf").read_bytes()
    assert refusal("guide.docx", data=pdf).code == "broken"
    assert refusal("notes.txt", data=b"abc\x00\x01\x02").code == "broken"
    assert refusal("notes.pdf", data=b"hello").code == "broken"


def test_a_docx_is_inflated_by_what_it_produces_not_what_its_directory_says() -> None:
    """Its directory says 1,000 bytes; the part really unpacks to 30 MB: refused at the cap,
    having held about a megabyte at a time (it was inflated whole: 200 MB took 449 MB)."""
    data = make_files.understated_docx(30_000_000)
    tracemalloc.start()
    try:
        caught = refusal("bomb.docx", Limits(100_000, 100), data=data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.code == "too_large" and "2000000" in caught.message
    assert peak < 8_000_000, peak


def test_a_docx_of_many_short_paragraphs_is_read_in_linear_time() -> None:
    """60,000 short paragraphs in 40 KB (python-docx looked each one's style up among all the
    styles: 328 s). A generous bound; it takes about a second."""
    began = time.monotonic()
    blocks = read(make_files.many_paragraphs_docx(), "many.docx", None, LIMITS)[1]
    assert len(blocks) == 60_000 and blocks[0] == Block("text", "x")
    assert time.monotonic() - began < 30


def test_a_docx_holding_more_text_than_its_limit_is_too_large() -> None:
    data = make_files.runs_docx(2_000_000)  # 86,956 one-letter runs in one paragraph
    assert read(data, "runs.docx", None, LIMITS)[1] == [Block("text", "a" * 86_956)]
    data = make_files.docx_with_body(b"<w:p><w:r><w:t>" + b"a" * 200_000 + b"</w:t></w:r></w:p>")
    caught = refusal("long.docx", Limits(max_bytes=60_000, max_pages=100), data=data)
    assert caught.code == "too_large" and "60000 characters" in caught.message


def test_pdf_pages_that_share_one_content_stream_are_read_once_and_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,999 pages drawing one stream of 14 KB of text: one extraction, and the text past
    the limit refused (each page was extracted again: 1.2 s a page, 308 MB of text)."""
    from pypdf import PageObject

    calls = []
    extract = PageObject.extract_text

    def counted(self: PageObject, *args: Any, **kwargs: Any) -> str:
        calls.append(1)
        return extract(self, *args, **kwargs)

    monkeypatch.setattr(PageObject, "extract_text", counted)
    data = make_files.shared_stream_pdf(pages=1999, lines=300)
    caught = refusal("shared.pdf", Limits(max_bytes=1_000_000, max_pages=2000), data=data)
    assert caught.code == "too_large" and "1000000 characters" in caught.message
    assert len(calls) == 1
    calls.clear()
    blocks = read(make_files.shared_stream_pdf(pages=3, lines=3), "three.pdf", None, LIMITS)[1]
    assert [b.page for b in blocks] == [1, 2, 3] and len(calls) == 1


def test_a_small_docx_may_unpack_to_20_times_its_size_not_to_20_times_the_limit() -> None:
    """A 180 KB DOCX of 60 MB of XML (issue 58's was 209 KB) is refused: 20 times its size,
    a file under a mebibyte counted as one, not 20 times DOCUMENT_MAX_BYTES (400 MB)."""
    data = make_files.runs_docx(60_000_000)
    assert len(data) < 250_000
    began = time.monotonic()
    caught = refusal("runs.docx", Limits(max_bytes=20 * 1024 * 1024, max_pages=100), data=data)
    assert caught.code == "too_large" and str(20 * 1024 * 1024) in caught.message
    assert time.monotonic() - began < 60  # about 5 s: 20 MB of XML read, not 60
