"""Planning one sync pass of a source: what to read, what to delete, and whether deleting is safe.

Pure: no I/O, no framework. The input is a listing (path, size, stamp) and the ledger of what the last passes
published (resources/source_sync.py fetches both); the output says which files must be read (new ones, and
those whose size or stamp moved: only their bytes are read and hashed; with a rehash, some or all unchanged
ones too), which ledger entries vanished, and whether the vanished ones may be deleted. It also says whether
two sources of a tenant could name the same document (``sources_collide``).

The safety rule (issue 29; LangChain's ``scoped_full`` cleanup deleted everything on an empty input): a pass
that failed to list, listed nothing, or would delete more than ``max_delete_share`` of the ledger deletes
nothing and says why, unless ``allow_mass_delete``. New and changed files are still published.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

DEFAULT_MAX_DELETE_SHARE = 0.2
MAX_ERRORS_KEPT = 20


@dataclass(frozen=True)
class Listed:
    """A file as the listing saw it: path relative to the source root ('/'-separated), size, stamp."""

    path: str
    size: int
    stamp: str


@dataclass(frozen=True)
class LedgerEntry:
    """What a pass last published from a file (a source_file row)."""

    path: str
    document_id: str
    size: int
    stamp: str
    content_hash: str | None
    """The bytes last published from the file; None: nothing yet (its attempts so far failed)."""
    hashed_pass: int = 0
    """The pass that last read and hashed the file (source_file.pass): a rehash slice takes the oldest first."""
    error_code: str | None = None
    """The stable code of the last attempt's failure at this size and stamp (None: it succeeded). A failing file
    is tried again when its size or stamp moves, on ``--rehash`` or ``--retry-failed``, never on every pass."""


@dataclass(frozen=True)
class Plan:
    to_read: list[Listed]
    """New files and files whose size or stamp moved: the only ones whose bytes a pass reads."""
    new: int
    restamped: int
    unchanged: int
    vanished: list[LedgerEntry]
    """Ledger entries the listing no longer has, whose files had published a document."""
    delete_blocked: str | None = None
    """Why the vanished entries are kept this pass (None: they are deleted)."""
    listed: int = 0
    list_error: str | None = None
    failing: int = 0
    """Files not read because they failed at the size and stamp they still have."""
    forget: list[LedgerEntry] = field(default_factory=list)
    """Vanished entries that never published anything (failures only): their rows go, no document is deleted."""
    to_rehash: list[Listed] = field(default_factory=list)
    """Files whose size and stamp did not move, read anyway to compare their bytes with the ledger's hash
    (``--rehash``: all of them; a rehash slice: the ones hashed longest ago). Not counted in ``unchanged``."""

    @property
    def to_delete(self) -> list[LedgerEntry]:
        return [] if self.delete_blocked else self.vanished


@dataclass
class PassCounts:
    """What a pass did (also the report the sensor and CLI print and source.last_pass keeps)."""

    listed: int = 0
    unchanged: int = 0
    read: int = 0
    published: int = 0
    """New versions (new files, or changed bytes)."""
    same_bytes: int = 0
    """Read because the stamp moved, but the bytes are what was last published: only the ledger is updated."""
    deleted: int = 0
    vanished: int = 0
    failed: int = 0
    failing: int = 0
    """Files left alone because they failed at the size and stamp they still have (in the ledger, with a code)."""
    rehashed: int = 0
    """Read although size and stamp had not moved (``--rehash`` or the sensor's rehash slice)."""
    rehash_changed: int = 0
    """Of those, the files whose bytes had changed under the same size and stamp (published)."""
    deletes_blocked: str | None = None
    list_error: str | None = None
    skipped: str | None = None
    """Why the pass did not run at all (another pass of the source holds its lock)."""
    partial: bool = False
    """The pass stopped reading at its time budget; the next pass goes on (nothing is lost, the ledger tells)."""
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        parts = [f"listed {self.listed:,}", f"unchanged {self.unchanged:,}", f"read {self.read:,}",
                 f"published {self.published:,}", f"same bytes {self.same_bytes:,}",
                 f"deleted {self.deleted:,}/{self.vanished:,} vanished", f"failed {self.failed:,}"]
        if self.failing:
            parts.append(f"still failing {self.failing:,} (not retried until they change; --retry-failed)")
        if self.rehashed:
            parts.append(f"rehashed {self.rehashed:,} ({self.rehash_changed:,} changed under the same size and stamp)")
        text = ", ".join(parts)
        if self.partial:
            text += " (partial: time budget reached, the next pass goes on)"
        if self.list_error:
            text += f"; listing failed: {self.list_error}"
        if self.deletes_blocked:
            text += f"; deleted nothing: {self.deletes_blocked}"
        return text

    def fail(self, path: str, why: str) -> None:
        """A file this pass could not publish or delete (``why``: a stable code or an exception's name)."""
        self.failed += 1
        self.errors.append(f"{path}: {why}")

    def to_dict(self) -> dict[str, object]:
        """The report as stored and printed (the first errors only: a pass over a broken source stays small)."""
        return {**self.__dict__, "errors": self.errors[:MAX_ERRORS_KEPT]}


def plan_pass(
    listing: list[Listed] | None,
    ledger: list[LedgerEntry],
    *,
    max_delete_share: float = DEFAULT_MAX_DELETE_SHARE,
    allow_mass_delete: bool = False,
    list_error: str | None = None,
    rehash_all: bool = False,
    rehash_slice: int = 0,
    retry_failed: bool = False,
) -> Plan:
    """Compare a listing (None: listing failed, ``list_error`` says how) with the ledger.

    Size and stamp miss a change that keeps both (a rewrite within the stamp's resolution, an mtime restored by a
    copy tool). ``rehash_all`` also reads every file whose size and stamp did not move; ``rehash_slice`` reads at
    most that many of them, those hashed longest ago first, so that a slice per pass covers the whole source in
    turn. Without either, a pass over unchanged files reads no bytes.

    A file whose last attempt failed at the size and stamp it still has is not read again (it would fail at full
    cost on every pass), unless ``retry_failed``, ``rehash_all`` or its turn in a rehash slice."""
    known = {entry.path: entry for entry in ledger}
    if listing is None:
        return Plan(to_read=[], new=0, restamped=0, unchanged=0, vanished=[], listed=0,
                    list_error=list_error or "listing failed",
                    delete_blocked=f"the listing failed ({list_error or 'unknown error'})")
    to_read: list[Listed] = []
    same: list[LedgerEntry] = []  # the ledger's own objects: nothing allocated per unchanged file
    new = restamped = 0
    seen: set[str] = set()
    for item in listing:
        if item.path in seen:
            continue
        seen.add(item.path)
        entry = known.get(item.path)
        if entry is None:
            new += 1
            to_read.append(item)
        elif entry.size != item.size or entry.stamp != item.stamp:
            restamped += 1
            to_read.append(item)
        else:
            same.append(entry)
    if retry_failed and not rehash_all:
        to_read += [Listed(e.path, e.size, e.stamp) for e in same if e.error_code]
        same = [e for e in same if not e.error_code]
    if rehash_all:
        chosen = same
    elif rehash_slice > 0:
        chosen = sorted(same, key=lambda e: (e.hashed_pass, e.path))[:rehash_slice]
    else:
        chosen = []
    to_rehash = [Listed(e.path, e.size, e.stamp) for e in chosen]  # size and stamp: the listing's, unmoved
    rehashing = {e.path for e in chosen}
    failing = sum(1 for e in same if e.error_code and e.path not in rehashing)
    unchanged = len(same) - len(chosen) - failing
    gone = [entry for path, entry in sorted(known.items()) if path not in seen]
    vanished = [entry for entry in gone if entry.content_hash is not None]
    published = sum(1 for entry in known.values() if entry.content_hash is not None)
    blocked = None
    if vanished and not allow_mass_delete:
        share = len(vanished) / published
        if not seen:
            blocked = f"the listing is empty and the ledger has {published:,} files"
        elif share > max_delete_share:
            blocked = (f"{len(vanished):,} of {published:,} files vanished ({share:.0%}), "
                       f"more than the safety share of {max_delete_share:.0%}")
        if blocked:
            blocked += "; run `kbindex source sync NAME --allow-mass-delete` if that is intended"
    return Plan(to_read=to_read, new=new, restamped=restamped, unchanged=unchanged, vanished=vanished,
                delete_blocked=blocked, listed=len(seen), to_rehash=to_rehash, failing=failing,
                forget=[entry for entry in gone if entry.content_hash is None])


def needs_publish(entry: LedgerEntry | None, digest: str) -> bool:
    """After reading a file: publish unless the bytes are the ones last published (then only the ledger moves)."""
    return entry is None or entry.content_hash != digest


@lru_cache(maxsize=64)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_matches(path: str, pattern: str) -> bool:
    """Whether a relative path matches a glob: ``*`` and ``?`` stay within a folder, ``**`` crosses folders
    (``**/*.md``: every Markdown file at any depth; ``**``: everything)."""
    return _glob_regex(pattern).match(path) is not None


def glob_head(glob: str) -> str:
    """The literal start of a glob, up to its first wildcard: every path it matches starts with it
    (``policies/**`` -> ``policies/``; ``**/*.md`` -> ``""``)."""
    return re.split(r"[*?]", glob, maxsplit=1)[0]


def sources_collide(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two sources of one tenant, each ``(id_prefix, glob)``, could make the same document id
    (id = prefix + relative path). Conservative where it refuses: two globs with one literal head but disjoint
    endings (``*.md``, ``*.txt``) collide; distinct prefixes keep them apart.

    One case is left to each pass instead: a source whose glob starts with a wildcard (``**``) could hold a folder
    named like the other's prefix (``hr/``). Refusing it would make ``--prefix`` useless beside any unprefixed
    source; the prefix is taken as the statement that no such folder exists, and a pass refuses, per file, to
    publish over or delete a document another source's ledger names (resources/source_sync.py).
    """
    (prefix_a, glob_a), (prefix_b, glob_b) = sorted((a, b), key=lambda s: len(s[0]))
    if not prefix_b.startswith(prefix_a):
        return False  # the prefixes differ where both have a character: no id can start with both
    rest, head_a, head_b = prefix_b[len(prefix_a):], glob_head(glob_a), glob_head(glob_b)
    if rest and not head_a:
        return False
    x, y = head_a, rest + head_b
    return x.startswith(y) or y.startswith(x)


def is_hidden(path: str) -> bool:
    """Hidden files and folders are skipped (``.git/``, ``.DS_Store``), as ``kbindex publish DIR`` skips them."""
    return any(part.startswith(".") for part in path.split("/"))
