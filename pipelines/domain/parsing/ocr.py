"""OCR of a rendered page image with RapidOCR (``rapidocr-onnxruntime``): PP-OCRv4 detection and
Chinese+English recognition models ship inside that wheel, so nothing is downloaded at run time.

The engine takes about a second to load, so it is loaded once per process and shared; calls are
serialized (onnxruntime already uses every core for one image). Boxes come back in reading order;
boxes on the same line are joined with a space, lines with a line break."""

from __future__ import annotations

import threading
from typing import Any

OCR_PACKAGE = "rapidocr-onnxruntime"
DETECTION_SIDE = 1600
MIN_CONFIDENCE = 0.5
"""Recognized boxes below this score are dropped (mostly specks and image texture read as glyphs)."""

_engine: Any = None
_lock = threading.Lock()


def ocr_available() -> bool:
    """Whether the OCR package can be imported (it is a dependency, but a slim install may lack it)."""
    try:
        import rapidocr_onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _get_engine() -> Any:
    global _engine
    if _engine is None:
        from rapidocr_onnxruntime import RapidOCR

        # Detection on the page scaled to fit 1600 px (the default scales a page's *shorter* side up to 736 px,
        # which makes a wide strip huge: 20x slower on a scanned line, no better on a full page).
        _engine = RapidOCR(det_limit_type="max", det_limit_side_len=DETECTION_SIDE)
    return _engine


def ocr_image(pixels: Any) -> str:
    """The text RapidOCR reads in ``pixels`` (an RGB or grey numpy array), "" when it finds none.
    Raises ImportError when the package is missing; other exceptions mean this image failed."""
    with _lock:
        result, _ = _get_engine()(pixels, use_cls=False)  # scans are upright; the classifier costs time
    return _lines(result or [])


def _lines(result: list) -> str:
    """Join boxes ([corners, text, score]) into lines: a box whose vertical middle lies inside the previous
    box's height continues that line."""
    lines: list[list[str]] = []
    previous: tuple[float, float] | None = None
    for corners, text, score in result:
        if float(score) < MIN_CONFIDENCE or not str(text).strip():
            continue
        ys = [point[1] for point in corners]
        top, bottom = min(ys), max(ys)
        middle = (top + bottom) / 2
        if previous is not None and previous[0] <= middle <= previous[1]:
            lines[-1].append(str(text))
        else:
            lines.append([str(text)])
        previous = (top, bottom)
    return "\n".join(" ".join(parts) for parts in lines)
