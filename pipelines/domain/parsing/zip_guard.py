"""Checks an OOXML (zip) container before any library opens it: member count, declared
uncompressed size and compression ratio (zip bombs), and no DTD or entity declaration in any XML
part (entity-expansion bombs, external entities). Declared sizes bound what zipfile will inflate.

XML parts are checked streaming (64 KiB at a time, no tree kept), so the check itself holds almost
nothing; it also counts their elements, which is what python-docx/pptx/openpyxl pay memory for (about
250 bytes an element in python-docx's lxml tree and proxies): a part over ``max_xml_part_bytes``, or
parts totalling more than ``max_xml_elements`` elements, fail DOCUMENT_TOO_LARGE before any library
builds a tree; nesting deeper than ``MAX_XML_DEPTH`` (what lxml refuses anyway) fails PARSE_ERROR."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import ParseError as XmlParseError
from defusedxml.ElementTree import DefusedXMLParser

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import ParseLimits

_RATIO_MIN_BYTES = 1024 * 1024
"""Members smaller than this are never called bombs: tiny XML parts compress very well."""
MAX_XML_DEPTH = 256
"""libxml2's own limit (lxml without huge_tree, as python-docx/pptx parse): deeper parts are unreadable."""
_FEED = 64 * 1024


def check_ooxml_container(data: bytes, limits: ParseLimits, label: str) -> None:
    """Raise DOCUMENT_TOO_LARGE for a zip bomb, PARSE_ERROR for a broken zip or unsafe XML."""
    declared = _declared_members(data)
    if declared is not None and declared > limits.max_zip_members:  # before zipfile reads the whole list
        raise DocumentTooLarge(f"{label}: {declared} zip members, more than {limits.max_zip_members}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ParseError(f"{label}: not a valid zip container") from exc
    with archive:
        members = archive.infolist()  # the list zipfile read once when it opened; not read again
        if len(members) > limits.max_zip_members:
            raise DocumentTooLarge(f"{label}: {len(members)} zip members, more than {limits.max_zip_members}")
        total = sum(member.file_size for member in members)
        if total > limits.max_zip_uncompressed_bytes:
            raise DocumentTooLarge(
                f"{label}: {total:,} bytes uncompressed, more than {limits.max_zip_uncompressed_bytes:,} (zip bomb?)"
            )
        for member in members:
            ratio = member.file_size / max(member.compress_size, 1)
            if member.file_size > _RATIO_MIN_BYTES and ratio > limits.max_zip_ratio:
                raise DocumentTooLarge(f"{label}: a zip member expands {ratio:,.0f} times (zip bomb)")
        counter = _XmlCounter(limits, label)
        for member in members:
            if member.filename.endswith((".xml", ".rels")):
                if member.file_size > limits.max_xml_part_bytes:
                    raise DocumentTooLarge(
                        f"{label}: XML part {member.filename[:80]} is {member.file_size:,} bytes uncompressed, "
                        f"more than {limits.max_xml_part_bytes:,}")
                _check_xml(archive, member, label, counter)


class _XmlCounter:
    """Parser target counting elements (over all parts) and depth; keeps no tree."""

    def __init__(self, limits: ParseLimits, label: str) -> None:
        self.limits, self.label = limits, label
        self.elements = 0
        self.depth = 0

    def start(self, tag: str, attrib: dict) -> None:
        self.elements += 1
        self.depth += 1
        if self.elements > self.limits.max_xml_elements:
            raise DocumentTooLarge(
                f"{self.label}: more than {self.limits.max_xml_elements:,} XML elements in its parts")
        if self.depth > MAX_XML_DEPTH:
            raise ParseError(f"{self.label}: XML nested more than {MAX_XML_DEPTH} levels deep")

    def end(self, tag: str) -> None:
        self.depth -= 1

    def data(self, text: str) -> None:
        pass

    def close(self) -> None:
        return None


def _check_xml(archive: zipfile.ZipFile, member: zipfile.ZipInfo, label: str, counter: _XmlCounter) -> None:
    counter.depth = 0
    parser = DefusedXMLParser(target=counter, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    try:
        with archive.open(member) as stream:
            while chunk := stream.read(_FEED):
                parser.feed(chunk)
        parser.close()
    except DefusedXmlException as exc:
        raise ParseError(f"{label}: XML part declares a DTD or entities (entity bomb?); refused") from exc
    except XmlParseError as exc:
        raise ParseError(f"{label}: malformed XML part {member.filename[:80]}") from exc
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise ParseError(f"{label}: corrupt zip member {member.filename[:80]}") from exc


def _declared_members(data: bytes) -> int | None:
    """The member count the end-of-central-directory record declares (zip64 too), or None if unreadable.

    Read from the last few kilobytes only: a container declaring a million members is refused without
    building a million ZipInfo objects first.
    """
    try:
        end = zipfile._EndRecData(io.BytesIO(data))  # noqa: SLF001 - the stdlib's own EOCD reader
    except (OSError, ValueError, struct.error):
        return None
    if not end:
        return None
    return int(end[zipfile._ECD_ENTRIES_TOTAL])  # noqa: SLF001
