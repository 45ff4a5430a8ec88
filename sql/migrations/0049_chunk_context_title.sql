-- The document title a context profile's chunk was embedded with (issue 35), NULL under a profile without
-- context. The lexical index of a context profile reads it too (title + heading path + text, as the vector
-- does), and every path that writes lexical rows from stored chunk rows (a metadata-only version copying an
-- earlier one, the lexical backfill) reads it back from here: the title comes from the parse, which those
-- paths do not redo. It goes with its chunk (delete, retention, erase). Chunks of a context profile written
-- before this migration keep NULL, and lexical rows without the title, until their document is indexed again.
ALTER TABLE chunk ADD COLUMN context_title text;
