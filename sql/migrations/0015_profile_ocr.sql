-- OCR of scanned PDF pages (issue 16) costs seconds a page: an index profile can switch it off.
-- The indexing run passes it to parse_document(..., ocr=profile.ocr); off, scanned pages stay unread
-- (EMPTY_DOCUMENT when nothing else has text, saying OCR is off).
ALTER TABLE index_profile ADD COLUMN ocr boolean NOT NULL DEFAULT true;
