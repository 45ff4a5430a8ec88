"""Parser bombs (issue #31, finding 3): hostile files built on the spot, each parsed in a fresh child
process whose peak RSS is read from the kernel (``os.wait4``'s ``ru_maxrss``: every allocation, native
or Python, interpreter and imports included).

Used by ``python -m bench.abuse --bombs`` (figures) and ``tests/unit/test_parser_bombs.py`` (bounds).
Each maker writes its file into a folder and returns (path, filename to parse it as); all are quick to
make (a few seconds at most) and never hold more than a few MB besides the file itself."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
UPLOAD_MAX = 50 * MB
"""``ParseLimits.max_bytes``: every bomb fits in an upload."""

_CHILD = """
import json, sys, time
from pipelines.domain.errors import KbindexError
from pipelines.domain.parsing import parse_document
data = open(sys.argv[1], "rb").read()
started = time.monotonic()
try:
    doc = parse_document(data, filename=sys.argv[2])
except KbindexError as exc:
    answer = {"code": exc.code, "message": exc.message}
else:
    answer = {"code": "OK", "message": f"{len(doc.blocks)} blocks, {doc.char_count} characters"}
answer["seconds"] = time.monotonic() - started
with open("/proc/self/status") as status:  # this interpreter's own high-water mark (see parse_in_child)
    hwm = [line.split()[1] for line in status if line.startswith("VmHWM:")]
answer["peak_rss_mb"] = int(hwm[0]) / 1024 if hwm else None
json.dump(answer, sys.stdout)
"""


@dataclass(frozen=True)
class Outcome:
    code: str
    """The stable error code, OK, or KILLED/CRASHED (the child died: signal or exit status in message)."""
    message: str
    seconds: float
    """Wall time of the whole child (interpreter start, imports, read, parse)."""
    peak_rss_mb: float


def parse_in_child(path: Path, filename: str, timeout: float = 600.0, address_space_mb: int | None = None) -> Outcome:
    """Parse ``path`` as ``filename`` in a new interpreter running this checkout's code; its peak RSS.
    ``address_space_mb`` caps the child's virtual memory (RLIMIT_AS), to measure a blow-up safely."""

    def cap() -> None:
        if address_space_mb:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space_mb * MB, address_space_mb * MB))

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), filename], stdout=out, stderr=err,
                                 cwd=ROOT, env=env, preexec_fn=cap)
        killer = threading.Timer(timeout, child.kill)
        killer.start()
        try:
            # Reaped here, not by Popen.wait: wait4 gives this child's own rusage (RUSAGE_CHILDREN is a max
            # over every child this process ever waited for). Its ru_maxrss still counts the memory the
            # child had before exec, a copy of this process (a pytest session can be 1.6 GB), so a child
            # that finishes reports its own VmHWM instead; wait4's figure serves for one that was killed.
            _, status, usage = os.wait4(child.pid, 0)
        finally:
            killer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    seconds = time.monotonic() - started
    peak = usage.ru_maxrss / 1024  # KiB on Linux
    if child.returncode != 0:
        code = "KILLED" if child.returncode < 0 else "CRASHED"
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return Outcome(code, f"exit {child.returncode}: {tail[0][:200]}", seconds, peak)
    answer = json.loads(stdout)
    return Outcome(answer["code"], answer["message"], seconds, answer.get("peak_rss_mb") or peak)


# --- the bombs ----------------------------------------------------------------------------------------


def _write(path: Path, pieces: Callable[[], bytes], total: int) -> None:
    """``pieces()`` repeated until ``total`` bytes are written (the file is never whole in memory)."""
    with path.open("wb") as out:
        written = 0
        while written < total:
            piece = pieces()[: total - written]
            out.write(piece)
            written += len(piece)


def html_flat_elements(folder: Path) -> tuple[Path, str]:
    """50 MB of ``<i>a</i>``: 6.5 million elements, each a bs4 Tag of several hundred bytes."""
    path = folder / "flat.html"
    _write(path, lambda: b"<i>a</i>" * 131072, UPLOAD_MAX - 1024)
    return path, "flat.html"


def html_nested_elements(folder: Path) -> tuple[Path, str]:
    """50 MB of ``<b>a`` never closed: 10 million elements, nested as deep as the parser lets them."""
    path = folder / "nested.html"
    _write(path, lambda: b"<b>a" * 262144, UPLOAD_MAX - 1024)
    return path, "nested.html"


def _random_paragraphs(rng: random.Random) -> bytes:
    """~1 MB of small Word paragraphs with random words: compresses about 4:1, so no ratio check fires."""
    words = [rng.randbytes(3).hex().encode() for _ in range(24000)]
    return b"".join(b"<w:p><w:r><w:t>" + word + b"</w:t></w:r></w:p>" for word in words)


def _docx_with_document(document: Callable[[Callable[[bytes], None]], None], extra: dict[str, bytes] | None = None,
                        ) -> bytes:
    """A minimal .docx whose word/document.xml is streamed by ``document(write)`` (zip64, deflated)."""
    out = io.BytesIO()
    ns = b'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("[Content_Types].xml", (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.'
            'wordprocessingml.document.main+xml"/></Types>'))
        archive.writestr("_rels/.rels", (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
            'officeDocument" Target="word/document.xml"/></Relationships>'))
        for name, payload in (extra or {}).items():
            archive.writestr(name, payload)
        info = zipfile.ZipInfo("word/document.xml")
        info.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(info, "w", force_zip64=True) as member:
            member.write(b'<?xml version="1.0" encoding="UTF-8"?><w:document ' + ns + b"><w:body>")
            document(member.write)
            member.write(b"</w:body></w:document>")
    return out.getvalue()


def docx_paragraphs(folder: Path, megabytes: int = 150) -> tuple[Path, str]:
    """A .docx whose document.xml is 150 MB of small paragraphs (about 3.4 million, 10 million elements),
    random enough (about 4:1) that no ratio check calls it a bomb; under the 200 MB uncompressed cap."""
    rng = random.Random(31)
    blocks = [_random_paragraphs(rng) for _ in range(4)]

    def document(write: Callable[[bytes], None]) -> None:
        written = 0
        while written < megabytes * MB:
            block = blocks[written // len(blocks[0]) % len(blocks)]
            write(block)
            written += len(block)

    path = folder / "big-xml.docx"
    path.write_bytes(_docx_with_document(document))
    return path, "big-xml.docx"


def docx_40mb_xml(folder: Path) -> tuple[Path, str]:
    """A .docx whose document.xml is 40 MB of small paragraphs: under the part-size cap, ~2.7 million
    elements (python-docx alone would hold ~700 MB of them, ElementTree as much again)."""
    return docx_paragraphs(folder, 40)


def docx_deflate_bomb_parts(folder: Path) -> tuple[Path, str]:
    """A deflate bomb that passes the ratio check: 190 XML parts of just under 1 MiB each (below the 1 MiB
    threshold of the ratio check), each about 1,000:1 compressed; 190 MB of XML from a ~200 KB file."""
    part = b"<x>" + b"<a/>" * ((MB - 64) // 4) + b"</x>"
    extra = {f"customXml/item{i}.xml": part for i in range(190)}
    path = folder / "parts-bomb.docx"
    path.write_bytes(_docx_with_document(lambda write: write(b"<w:p><w:r><w:t>Refunds</w:t></w:r></w:p>"), extra))
    return path, "parts-bomb.docx"


def docx_deflate_bomb_member(folder: Path) -> tuple[Path, str]:
    """The classic: document.xml of 190 MB of one repeated paragraph, about 1,000:1 (ratio check)."""
    paragraph = b"<w:p><w:r><w:t>refund</w:t></w:r></w:p>" * 25000

    def document(write: Callable[[bytes], None]) -> None:
        for _ in range(190 * MB // len(paragraph)):
            write(paragraph)

    path = folder / "member-bomb.docx"
    path.write_bytes(_docx_with_document(document))
    return path, "member-bomb.docx"


def markdown_million_nodes(folder: Path) -> tuple[Path, str]:
    """One million list items (4 MB): five block tokens and an inline child each in markdown-it."""
    path = folder / "million.md"
    path.write_bytes(b"- a\n" * 1_000_000)
    return path, "million.md"


def markdown_million_inline(folder: Path) -> tuple[Path, str]:
    """One paragraph of a million emphasised words (6 MB): three inline child tokens each."""
    path = folder / "inline.md"
    path.write_bytes(b"*a* " * 1_500_000 + b"\n")
    return path, "inline.md"


def one_page_pdf(content_dict: bytes, content: bytes, extra: list[bytes] | None = None) -> bytes:
    """A one-page PDF written by hand (no generator library): its content stream (object 4) is ``content``
    under ``content_dict`` (its /Length added), in Helvetica (object 5); ``extra`` objects are numbered from 6.
    The bombs below and the parser tests build their PDFs with it."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d " % len(content) + content_dict + b" >>\nstream\n" + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        *(extra or []),
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def pdf_flate_bomb(folder: Path) -> tuple[Path, str]:
    """A one-page PDF whose content stream inflates to 1 GB of spaces (about 1 MB compressed)."""
    compressor = zlib.compressobj(9)
    chunk = b" " * MB
    body = b"".join(compressor.compress(chunk) for _ in range(1024)) + compressor.compress(
        b"BT /F1 12 Tf 72 720 Td (Refunds) Tj ET") + compressor.flush()
    pdf = one_page_pdf(b"/Filter /FlateDecode", body)
    path = folder / "flate-bomb.pdf"
    path.write_bytes(pdf)
    return path, "flate-bomb.pdf"


BOMBS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "html-50mb-flat-elements": html_flat_elements,
    "html-50mb-nested-elements": html_nested_elements,
    "docx-150mb-document-xml": docx_paragraphs,
    "docx-40mb-document-xml": docx_40mb_xml,
    "docx-deflate-bomb-190-parts": docx_deflate_bomb_parts,
    "docx-deflate-bomb-one-member": docx_deflate_bomb_member,
    "markdown-1m-list-items": markdown_million_nodes,
    "markdown-1m-inline-nodes": markdown_million_inline,
    "pdf-flate-bomb-1gb-stream": pdf_flate_bomb,
}


def run(names: list[str] | None = None, address_space_mb: int | None = None, indent: str = "") -> None:
    """Make each bomb, parse it in a child, print code, seconds and peak RSS (the file is deleted after)."""
    with tempfile.TemporaryDirectory(prefix="kbindex-bombs-") as folder:
        for name in names or list(BOMBS):
            t = time.monotonic()
            path, filename = BOMBS[name](Path(folder))
            made = time.monotonic() - t
            outcome = parse_in_child(path, filename, address_space_mb=address_space_mb)
            print(f"{indent}{name}: {outcome.code} in {outcome.seconds:.1f} s, peak RSS {outcome.peak_rss_mb:.0f} MB "
                  f"({path.stat().st_size / MB:.1f} MB file made in {made:.1f} s; {outcome.message[:90]})", flush=True)
            path.unlink()


if __name__ == "__main__":
    # python -m bench.abuse.bombs [NAME ...]; KBINDEX_BOMBS_AS_MB=8000 caps each child's address space
    # (to measure code that blows up without taking the machine down).
    run(sys.argv[1:], int(os.environ.get("KBINDEX_BOMBS_AS_MB", "0")) or None)
