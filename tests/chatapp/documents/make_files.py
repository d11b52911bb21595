"""Writes the PDF and DOCX files under files/ (committed; run again only to change them).

    python -m tests.chatapp.documents.make_files

The PDFs are written by hand (a page is a content stream of text operators) and passed through
pypdf's writer, which adds the outline and the encryption; the DOCX files with python-docx.
The hostile files of issue 58 (`many_paragraphs_docx`, `runs_docx`, `understated_docx`,
`shared_stream_pdf`) are made by the tests that read them, not kept here.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path

import docx
from pypdf import PdfReader, PdfWriter

FILES = Path(__file__).parent / "files"
_OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

GUIDE_PAGES = [
    [
        "Installing the kettle",
        "Fill the kettle with fresh water up to the MAX line.",
        "Never run the kettle dry: the thermal fuse trips and it must be reset.",
    ],
    [
        "Descaling",
        "Descale once a month in hard water areas with citric acid.",
        "Boil a litre of water with two spoons of citric acid and leave it for an hour.",
    ],
    [
        "Warranty",
        "The warranty lasts 24 months from the date on the receipt.",
        "It does not cover limescale damage.",
    ],
]


def _pdf_object(number: int, body: bytes) -> bytes:
    return b"%d 0 obj\n" % number + body + b"\nendobj\n"


def _raw_pdf(pages: list[list[str]], *, image_only: bool = False) -> bytes:
    """A PDF whose pages draw `pages`' lines as text (or, image_only, a grey picture)."""
    objects: list[bytes] = []
    kids = []
    font = 3
    first_page = 4
    for index, lines in enumerate(pages):
        page_number = first_page + 2 * index
        content_number = page_number + 1
        kids.append(b"%d 0 R" % page_number)
        if image_only:
            stream = b"q 200 0 0 200 100 500 cm /Im1 Do Q"
            resources = (
                b"<< /XObject << /Im1 << /Type /XObject /Subtype /Image /Width 2 "
                b"/Height 2 /ColorSpace /DeviceGray /BitsPerComponent 8 /Length 4 >> "
                b">> >>"
            )
        else:
            ops = [b"BT /F1 12 Tf 72 720 Td 16 TL"]
            for line in lines:
                ops.append(b"(" + line.encode("latin-1") + b") Tj T* T*")
            ops.append(b"ET")
            stream = b"\n".join(ops)
            resources = b"<< /Font << /F1 %d 0 R >> >>" % font
        objects.append(
            _pdf_object(
                page_number,
                b"<< /Type /Page /Parent 2 0 R /MediaBox "
                b"[0 0 612 792] /Resources " + resources + b" /Contents %d 0 R >>" % content_number,
            )
        )
        objects.append(
            _pdf_object(
                content_number,
                b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
            )
        )
    head = [
        _pdf_object(1, b"<< /Type /Catalog /Pages 2 0 R >>"),
        _pdf_object(
            2, b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(pages)
        ),
        _pdf_object(3, b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"),
    ]
    every = sorted(head + objects, key=lambda body: int(body.split(b" ", 1)[0]))
    out = b"%PDF-1.4\n"
    offsets = []
    for body in every:
        offsets.append(len(out))
        out += body
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(every) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(every) + 1, xref)
    return out


def _through_writer(raw: bytes, *, outline: bool = False, password: str | None = None) -> bytes:
    writer = PdfWriter()
    writer.append(PdfReader(io.BytesIO(raw)))
    if outline:
        for index, lines in enumerate(GUIDE_PAGES):
            writer.add_outline_item(title=lines[0], page_number=index)
    if password is not None:
        writer.encrypt(
            user_password=password, owner_password=password + "-owner", algorithm="AES-128"
        )
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _guide_docx() -> bytes:
    document = docx.Document()
    document.add_heading("Kettle manual", level=0)
    document.add_heading("Descaling", level=1)
    document.add_paragraph("Descale once a month in hard water areas with citric acid.")
    document.add_heading("Settings", level=2)
    table = document.add_table(rows=3, cols=2)
    for row, (name, value) in zip(
        table.rows,
        [("Setting", "Temperature"), ("Green tea", "80 C"), ("Black tea", "100 C")],
        strict=True,
    ):
        row.cells[0].text = name
        row.cells[1].text = value
    document.add_paragraph("The warranty lasts 24 months from the date on the receipt.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _docx_without_body() -> bytes:
    """A zip named .docx that lacks word/document.xml."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
    return out.getvalue()


def docx_with_body(body: bytes) -> bytes:
    """A python-docx document whose body is `body` (WordprocessingML elements)."""
    base = io.BytesIO()
    docx.Document().save(base)
    source = zipfile.ZipFile(base)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "word/document.xml":
                head, _, rest = data.partition(b"<w:body>")
                data = head + b"<w:body>" + body + b"</w:body>" + rest.partition(b"</w:body>")[2]
            archive.writestr(info.filename, data)
    return out.getvalue()


def many_paragraphs_docx(count: int = 60_000) -> bytes:
    """Short paragraphs, many of them (issue 58: 60,000 in 45 KB took 328 s to read)."""
    return docx_with_body(b"<w:p><w:r><w:t>x</w:t></w:r></w:p>" * count)


def runs_docx(xml_bytes: int) -> bytes:
    """One paragraph of one-letter runs, `xml_bytes` of XML in a small zip (issue 58: 60 MB of
    XML in 209 KB was still being read after 27 minutes, at 1.46 GB)."""
    run = b"<w:r><w:t>a</w:t></w:r>"
    return docx_with_body(b"<w:p>" + run * (xml_bytes // len(run)) + b"</w:p>")


def slow_note_docx(xml_bytes: int = 19_000_000) -> bytes:
    """`xml_bytes` of empty runs, then one sentence: seconds to read, one passage to embed."""
    empty = b"<w:r><w:t></w:t></w:r>"
    note = b"<w:p><w:r><w:t>The kettle boils a litre in three minutes.</w:t></w:r></w:p>"
    return docx_with_body(b"<w:p>" + empty * (xml_bytes // len(empty)) + b"</w:p>" + note)


def understated_docx(real_bytes: int) -> bytes:
    """A zip whose directory says its document part unpacks to 1,000 bytes, which really
    unpacks to `real_bytes`: the sizes in both headers are rewritten after the fact."""
    body = b"<w:p><w:r><w:t>" + b"a" * real_bytes + b"</w:t></w:r></w:p>"
    data = bytearray(docx_with_body(body))
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    info = archive.getinfo("word/document.xml")
    small = (1000).to_bytes(4, "little")
    data[info.header_offset + 22 : info.header_offset + 26] = small  # local header
    central = bytes(data).rindex(b"PK\x01\x02", 0, bytes(data).index(b"PK\x05\x06"))
    while bytes(data[central + 46 : central + 46 + 17]) != b"word/document.xml":
        central = bytes(data).rindex(b"PK\x01\x02", 0, central)
    data[central + 24 : central + 28] = small  # the central directory's entry
    return bytes(data)


def shared_stream_pdf(pages: int, lines: int) -> bytes:
    """`pages` pages that all draw one content stream of `lines` lines (issue 58: 1,999 such
    pages in 315 KB read at 1.2 s a page, 308 MB of text)."""
    ops = [b"BT /F1 10 Tf 72 720 Td 12 TL"]
    ops += [b"(Line %d of the page every page draws.) Tj T*" % n for n in range(lines)]
    stream = zlib.compress(b"\n".join([*ops, b"ET"]), 9)
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        4: b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream)
        + stream
        + b"\nendstream",
    }
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    )
    objects |= {5 + n: page for n in range(pages)}
    kids = b" ".join(b"%d 0 R" % (5 + n) for n in range(pages))
    objects[2] = b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages
    out = b"%PDF-1.4\n"
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += _pdf_object(number, objects[number])
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in sorted(objects))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return out


def main() -> None:
    FILES.mkdir(exist_ok=True)
    guide = _through_writer(_raw_pdf(GUIDE_PAGES), outline=True)
    (FILES / "guide.pdf").write_bytes(guide)
    (FILES / "scanned.pdf").write_bytes(_through_writer(_raw_pdf([[]], image_only=True)))
    (FILES / "encrypted.pdf").write_bytes(_through_writer(_raw_pdf(GUIDE_PAGES), password="s3"))
    (FILES / "broken.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)
    (FILES / "guide.docx").write_bytes(_guide_docx())
    (FILES / "broken.docx").write_bytes(_docx_without_body())
    # Word writes a password-protected .docx as an OLE compound file (MS-OFFCRYPTO); the
    # reader refuses it by that container's signature, which is all this file carries.
    (FILES / "encrypted.docx").write_bytes(_OLE_SIGNATURE + bytes(504))


if __name__ == "__main__":
    main()
