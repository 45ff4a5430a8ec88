"""E-mail (.eml, RFC 5322/MIME) via the standard library's ``email`` package.

Headers (From, To, Cc, Date, Subject, Message-ID) go to the document's metadata; the subject heads
the body's section. The body is the text/plain part, else the text/html part (through the HTML
parser). Each attachment is parsed by its own parser (detected like any upload) as a section
"<subject> > Attachment: <name>", within what is left of the message's limits (characters, time).
An attachment that cannot be read (an image, an encrypted PDF, a zip bomb) is a warning on the
message, not a failure of it; attached messages are followed at most ``MAX_DEPTH`` deep."""

from __future__ import annotations

from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from pipelines.domain.errors import DocumentError, EmptyDocument, ParseError
from pipelines.domain.parsing.model import BlockCollector, ParsedDocument
from pipelines.domain.parsing.text_format import decode_text, paragraphs

EML = "message/rfc822"
MAX_DEPTH = 3
MAX_ATTACHMENTS = 100
_HEADERS = ("from", "to", "cc", "date", "subject", "message-id")
_MAIL_HEADERS = frozenset({"from", "to", "date", "subject", "message-id", "mime-version", "received", "return-path"})


def parse_eml(data: bytes, collector: BlockCollector, media_type: str = EML) -> ParsedDocument:
    label = collector.label
    try:
        message = BytesParser(policy=policy.default).parsebytes(data)
        names = {key.lower() for key in message.keys()}
    except Exception as exc:  # the parser is lenient; header decoding can still fail
        raise ParseError(f"{label}: unreadable e-mail message ({type(exc).__name__})") from exc
    if not names & _MAIL_HEADERS or message.defects and not names & {"from", "subject", "date"}:
        raise ParseError(f"{label}: not an e-mail message (no mail headers)")
    headers = {name: _header(message, name) for name in _HEADERS}
    collector.metadata["email"] = {name: value[:300] for name, value in headers.items() if value}
    subject = collector.heading(headers["subject"]) if headers["subject"] else ""
    path = (subject,) if subject else ()
    if subject:
        collector.note_heading(path)
    _body(message, collector, path)
    _attachments(message, collector, path)
    return collector.finish(media_type, empty_hint="the message has no body text and no readable attachment")


def _header(message: EmailMessage, name: str) -> str:
    try:
        values = message.get_all(name) or []
        return ", ".join(str(value) for value in values).replace("\n", " ").strip()
    except Exception:  # a malformed header is dropped, not fatal
        return ""


def _body(message: EmailMessage, collector: BlockCollector, path: tuple[str, ...]) -> None:
    body = message.get_body(preferencelist=("plain", "html"))
    if body is None:
        return
    payload = body.get_payload(decode=True) or b""
    if body.get_content_subtype() == "html":
        try:
            _embedded(payload, "body.html", "text/html", collector, path)
        except EmptyDocument:
            pass
        return
    text = _decode(payload, body.get_content_charset(), collector.label)
    for paragraph in paragraphs(text.replace("\r\n", "\n").replace("\r", "\n")):
        collector.add(paragraph, path)


def _decode(payload: bytes, charset: str | None, label: str) -> str:
    if charset:
        try:
            return payload.decode(charset)
        except (LookupError, UnicodeDecodeError):
            pass
    return decode_text(payload, label)


def _attachments(message: EmailMessage, collector: BlockCollector, path: tuple[str, ...]) -> None:
    for index, part in enumerate(message.iter_attachments(), 1):
        if index > MAX_ATTACHMENTS:
            collector.warn(f"only the first {MAX_ATTACHMENTS} attachments are indexed")
            return
        collector.check_time()
        name = (part.get_filename() or f"attachment-{index}").replace("\n", " ")[:120]
        if part.get_content_type() == EML:  # an attached message: its bytes are the inner message
            inner = part.get_payload()
            data = inner[0].as_bytes() if isinstance(inner, list) and inner else part.get_payload(decode=True) or b""
        else:
            data = part.get_payload(decode=True) or b""
        try:
            _embedded(data, name, part.get_content_type(), collector, (*path, f"Attachment: {name}"))
        except DocumentError as exc:  # one unreadable attachment does not fail the message
            collector.warn(f"attachment {name}: {exc.code} ({exc.message[:150]})")
            collector.metadata.setdefault("attachments_failed", []).append({"name": name, "code": exc.code})


def _embedded(data: bytes, name: str, media_type: str, collector: BlockCollector, path: tuple[str, ...]) -> None:
    """Parse ``data`` with its own parser into ``collector`` under ``path``."""
    from pipelines.domain.parsing import parse_embedded

    if collector.depth >= MAX_DEPTH:
        collector.warn(f"{name}: nested more than {MAX_DEPTH} messages deep; not indexed")
        return
    parse_embedded(data, filename=name, media_type=media_type, parent=collector, heading_path=path)
