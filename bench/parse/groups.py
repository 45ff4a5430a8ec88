"""Parse groups of the benchmark, in a module of their own so that spawned children can import them."""

from __future__ import annotations

import io
import resource
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _files(corpus: Path, group: str) -> list[tuple[str, bytes]]:
    """(filename, bytes) of one group: corpus files, or generated ones for formats the corpus lacks."""
    if group == "pdf":
        paths = sorted((corpus / "pdf-samples").rglob("*.pdf"))
        return [(p.name, p.read_bytes()) for p in paths if "password" not in p.name]
    if group == "pdf-zh-251p":
        return [("zh.pdf", (corpus / "zh-debian-reference" / "debian-reference.zh-cn.pdf").read_bytes())]
    if group == "html":
        return [(p.name, p.read_bytes()) for p in sorted((corpus / "zh-debian-reference").glob("*.html"))]
    if group == "rst":
        return [(p.name, p.read_bytes()) for p in sorted((corpus / "en-peps").glob("*.rst"))[:200]]
    if group == "txt":
        return [(p.name, p.read_bytes()) for p in sorted((corpus / "en-sotu").glob("*.txt"))]
    return _generated(corpus, group)


def _generated(corpus: Path, group: str) -> list[tuple[str, bytes]]:
    sotu = [p.read_text(encoding="utf-8") for p in sorted((corpus / "en-sotu").glob("*.txt"))[:20]]
    paragraphs = [para for text in sotu for para in text.splitlines() if para.strip()]
    if group == "pptx*":
        import pptx

        deck = pptx.Presentation()
        for index, para in enumerate(paragraphs[:200]):
            slide = deck.slides.add_slide(deck.slide_layouts[1])
            slide.shapes.title.text = f"Slide {index}"
            slide.placeholders[1].text_frame.text = para
        out = io.BytesIO()
        deck.save(out)
        return [("deck.pptx", out.getvalue())]
    if group == "xlsx*":
        import openpyxl

        book = openpyxl.Workbook(write_only=True)
        sheet = book.create_sheet("Speeches")
        sheet.append(["Paragraph", "Words", "Text"])
        for index, para in enumerate(paragraphs[:5000]):
            sheet.append([index, len(para.split()), para[:500]])
        out = io.BytesIO()
        book.save(out)
        return [("speeches.xlsx", out.getvalue())]
    if group == "csv*":
        import csv

        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["paragraph", "words", "text"])
        for index, para in enumerate(paragraphs[:5000]):
            writer.writerow([index, len(para.split()), para[:500]])
        return [("speeches.csv", out.getvalue().encode())]
    if group == "eml*":
        from email.message import EmailMessage

        mails = []
        for index in range(50):
            message = EmailMessage()
            message["From"], message["To"], message["Subject"] = "a@example.com", "b@example.com", f"Speech {index}"
            message.set_content("\n\n".join(paragraphs[index * 5 : index * 5 + 5]))
            message.add_attachment("\n\n".join(paragraphs[index * 5 + 5 : index * 5 + 15]).encode(), maintype="text",
                                   subtype="plain", filename="more.txt")
            mails.append((f"m{index}.eml", message.as_bytes()))
        return mails
    if group == "ocr*":
        from PIL import Image, ImageDraw, ImageFont

        font = ImageFont.load_default(size=28)
        pages = []
        for page in range(OCR_PAGES):
            image = Image.new("L", (1240, 1754), 255)  # A4 at 150 dpi
            draw = ImageDraw.Draw(image)
            for line in range(25):
                words = " ".join(paragraphs).split()[(page * 25 + line) * 11 :][:11]
                draw.text((90, 100 + 60 * line), " ".join(words), fill=0, font=font)
            pages.append(image)
        out = io.BytesIO()
        pages[0].save(out, "PDF", resolution=150, save_all=True, append_images=pages[1:])
        zh = (ROOT / "tests" / "fixtures" / "documents" / "scanned-zh-debian-reference.pdf").read_bytes()
        return [("scan-en.pdf", out.getvalue()), ("scan-zh.pdf", zh)]
    raise ValueError(group)


OCR_PAGES = 4
GROUPS = ("pdf", "pdf-zh-251p", "html", "rst", "txt", "pptx*", "xlsx*", "csv*", "eml*", "ocr*")


def _run_group(corpus: str, group: str, engine: str, ocr_pages: int, queue) -> None:
    """In a child process: parse every file of ``group``; put a result row (or the error) on ``queue``."""
    global OCR_PAGES
    OCR_PAGES = ocr_pages
    try:
        queue.put(_measure(corpus, group, engine))
    except Exception as exc:  # the parent must not wait forever for a row
        queue.put({"group": group, "error": f"{type(exc).__name__}: {exc}"})


def _measure(corpus: str, group: str, engine: str) -> dict:
    import logging

    logging.disable(logging.WARNING)  # pypdf's repair chatter
    from pipelines.domain.parsing import ParseLimits, parse_document
    from pipelines.domain.parsing import pdf_format

    if engine == "pypdf":
        def refuse(data, label):
            raise ImportError("benchmarking pypdf")
        pdf_format._PdfiumPages = refuse
    files = _files(Path(corpus), group)
    if group == "ocr*":
        from pipelines.domain.parsing import ocr

        ocr._get_engine()  # load time is not OCR throughput
    limits = ParseLimits(max_time_s=3600, time_limit_s=600)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pages = chars = failed = ocr_pages = 0
    ocr_seconds = 0.0
    started = time.perf_counter()
    for name, data in files:
        try:
            doc = parse_document(data, filename=name, limits=limits)
        except Exception:
            failed += 1
            continue
        pages += doc.page_count or 1
        chars += doc.char_count
        ocr_pages += doc.metadata.get("ocr_pages", 0)
        ocr_seconds += doc.metadata.get("ocr_seconds", 0.0)
    seconds = time.perf_counter() - started
    size = sum(len(data) for _, data in files)
    return {
        "group": group + ("" if engine == "pdfium" else f" ({engine})"), "files": len(files), "failed": failed,
        "pages": pages, "MB": round(size / 2**20, 2), "seconds": round(seconds, 2),
        "pages_per_s": round(pages / seconds, 1) if seconds else None,
        "MB_per_s": round(size / 2**20 / seconds, 2) if seconds else None, "chars": chars,
        "text_pages_per_s": round((pages - ocr_pages) / (seconds - ocr_seconds), 1) if seconds > ocr_seconds else None,
        "ocr_pages": ocr_pages, "ocr_seconds": round(ocr_seconds, 2),
        "ocr_pages_per_s": round(ocr_pages / ocr_seconds, 3) if ocr_seconds else None,
        "peak_rss_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_growth_MB": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024),
    }
