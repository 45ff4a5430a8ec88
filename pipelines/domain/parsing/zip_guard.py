"""Checks an OOXML (zip) container before any library opens it: member count, declared
uncompressed size and compression ratio (zip bombs), and no DTD or entity declaration in any XML
part (entity-expansion bombs, external entities). Declared sizes bound what zipfile will inflate."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import ParseError as XmlParseError
from defusedxml.ElementTree import fromstring

from pipelines.domain.errors import DocumentTooLarge, ParseError
from pipelines.domain.parsing.model import ParseLimits

_RATIO_MIN_BYTES = 1024 * 1024
"""Members smaller than this are never called bombs: tiny XML parts compress very well."""


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
        for member in members:
            if member.filename.endswith((".xml", ".rels")):
                _check_xml(archive, member, label)


def _check_xml(archive: zipfile.ZipFile, member: zipfile.ZipInfo, label: str) -> None:
    try:
        fromstring(archive.read(member), forbid_dtd=True, forbid_entities=True, forbid_external=True)
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
