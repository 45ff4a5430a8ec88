"""The artifact store's layout (root/task-<id>/<stage>.pickle), its deletes, and RunState.discard (#28, defect 5)."""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import time

import pytest

from pipelines.domain.errors import ArtifactUntrusted
from resources.artifact_store import ArtifactStore
from resources.run_state import STAGES, RunState, artifact_key


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_tasks_outputs_live_in_its_own_folder_one_file_per_stage(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    store.put("parsed_document", 7, {"text": "secret"})
    store.put("document_chunks", artifact_key(7), ["a", "b"])  # the bench names a task by its key
    store.put("parsed_document", 12, {"text": "other"})
    assert _files(tmp_path / "artifacts") == [
        "task-12/parsed_document.pickle", "task-7/document_chunks.pickle", "task-7/parsed_document.pickle"]
    assert store.get("document_chunks", 7) == ["a", "b"]
    assert store.get("parsed_document", "task-7") == {"text": "secret"}
    assert sorted(store.task_ids()) == [7, 12]
    assert _mode(tmp_path / "artifacts" / "task-7") == 0o700
    assert _mode(tmp_path / "artifacts" / "task-7" / "parsed_document.pickle") == 0o600
    with pytest.raises(KeyError):
        store.get("chunk_embeddings", 7)


@pytest.mark.parametrize("key", ["acme/doc/v1", "task-0", "task-07", "../task-1", 0, -3])
def test_keys_that_are_not_task_ids_are_refused(tmp_path, key):
    with pytest.raises(ValueError):
        ArtifactStore(tmp_path).put("parsed_document", key, 1)


@pytest.mark.parametrize("stage", ["../x", "Parsed", "", "a/b"])
def test_stage_names_are_plain_identifiers(tmp_path, stage):
    with pytest.raises(ValueError):
        ArtifactStore(tmp_path).put(stage, 1, 1)


def test_delete_task_removes_every_stage_and_the_folder_and_nothing_else(tmp_path):
    root = tmp_path / "artifacts"
    store = ArtifactStore(root)
    for stage in STAGES:
        store.put(stage, 3, stage)
        store.put(stage, 4, stage)
    (root / "task-3" / f".parsed_document.{'0' * 32}.tmp").write_bytes(b"interrupted put")
    assert store.delete_task(3) == 4
    assert not (root / "task-3").exists()
    assert _files(root) == [f"task-4/{stage}.pickle" for stage in sorted(STAGES)]
    assert store.delete_task(3) == 0  # already gone: nothing to do, no error
    assert list(store.task_ids()) == [4]


def test_delete_task_keeps_files_younger_than_the_cutoff(tmp_path):
    root = tmp_path / "artifacts"
    store = ArtifactStore(root)
    store.put("parsed_document", 5, "old")
    store.put("document_chunks", 5, "young")
    old = time.time() - 7200
    os.utime(root / "task-5" / "parsed_document.pickle", (old, old))
    assert store.delete_task(5, modified_before=time.time() - 3600) == 1
    assert _files(root) == ["task-5/document_chunks.pickle"]


def test_old_layout_folders_are_recognised_and_only_their_own_files_deleted(tmp_path):
    root = tmp_path / "artifacts"
    digest = hashlib.sha256(b"acme/doc/v1").hexdigest()
    legacy = root / (hashlib.sha256(b"document_chunks").hexdigest()[:8] + "-document_chunks")
    (legacy / digest[:2]).mkdir(parents=True)
    (legacy / digest[:2] / f"{digest}.pickle").write_bytes(b"old")
    (legacy / digest[:2] / f"{digest}.{'a' * 32}.tmp").write_bytes(b"old")
    (root / "deadbeef-notes").mkdir()  # not the digest of its name: not ours
    (root / "deadbeef-notes" / "keep.txt").write_bytes(b"someone else's")
    store = ArtifactStore(root)
    assert store.legacy_folders() == [legacy]
    assert store.delete_legacy(legacy) == 2
    assert not legacy.exists()
    assert _files(root) == ["deadbeef-notes/keep.txt"]


def test_discard_deletes_the_stored_outputs_of_every_stage_and_forget_keeps_them(tmp_path):
    root = tmp_path / "artifacts"
    state = RunState(ArtifactStore(root))
    for task_id in (1, 2):
        for stage in STAGES:
            state.put(stage, task_id, ("fp", stage), f"{stage} of {task_id}")
    state.forget(1)  # lost its lease: whoever runs it next may reuse them
    assert RunState(ArtifactStore(root)).get("document_chunks", 1, ("fp", "document_chunks")) == "document_chunks of 1"
    state.discard(2)  # ended in this run
    with pytest.raises(KeyError):
        state.get("document_chunks", 2, ("fp", "document_chunks"))
    assert _files(root) == [f"task-1/{stage}.pickle" for stage in sorted(STAGES)]
    state.discard(1)
    assert _files(root) == [] and list(ArtifactStore(root).task_ids()) == []


def test_discard_never_raises_for_the_disk(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path / "artifacts")
    state = RunState(store)
    state.put("parsed_document", 9, "fp", "text")

    def broken(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(store, "delete_task", broken)
    state.discard(9)  # the task's outcome is recorded already: no error for the step
    assert (tmp_path / "artifacts" / "task-9" / "parsed_document.pickle").exists()  # left for the sweep


# Issue #31, finding 2: artifacts are pickles, so a file someone else could have written is never loaded.

class _Payload:
    """What an attacker's pickle does when loaded: create a marker file."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(store, tmp_path, task_id=5):
    """A pickle with the attacker's payload where the store would read task ``task_id``'s parsed document."""
    store.put("parsed_document", task_id, {"text": "ours"})  # folders as put() makes them (0700), ours
    path = store.task_folder(task_id) / "parsed_document.pickle"
    marker = tmp_path / "pwned"
    path.write_bytes(pickle.dumps(_Payload(marker)))
    return path, marker


def _refused(store, marker, what):
    with pytest.raises(ArtifactUntrusted, match=what) as caught:
        store.get("parsed_document", 5)
    assert caught.value.code == "ARTIFACT_UNTRUSTED"
    assert not marker.exists()  # nothing was unpickled


def test_the_planted_pickle_does_run_code_when_its_file_passes_the_checks(tmp_path):
    """The payload is real: a 0600 file of ours in our 0700 folders is loaded (that is the store's job)."""
    store = ArtifactStore(tmp_path / "artifacts")
    _, marker = _plant(store, tmp_path)
    store.get("parsed_document", 5)
    assert marker.exists()


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602], ids=oct)
def test_a_group_or_other_writable_artifact_is_not_loaded(tmp_path, mode):
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    os.chmod(path, mode)
    _refused(store, marker, "writable by group or others")


@pytest.mark.parametrize("folder", ["task", "root"])
def test_an_artifact_in_a_folder_others_can_write_is_not_loaded(tmp_path, folder):
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    os.chmod(path.parent if folder == "task" else store.root, 0o777)
    _refused(store, marker, "writable by group or others")


def test_an_artifact_another_user_owns_is_not_loaded(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)  # nobody
    else:  # cannot give a file away: run as a uid that does not own it
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)
    _refused(store, marker, "owned by uid")


def test_a_symbolic_link_to_someone_elses_pickle_is_not_followed(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    elsewhere = tmp_path / "elsewhere.pickle"
    os.replace(path, elsewhere)
    path.symlink_to(elsewhere)
    _refused(store, marker, "not a regular file")


def test_a_task_folder_that_is_a_symbolic_link_is_not_followed(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    attacker = tmp_path / "attacker"
    os.replace(path.parent, attacker)
    path.parent.symlink_to(attacker)
    _refused(store, marker, "not a folder")


def test_run_state_passes_the_refusal_on_instead_of_treating_it_as_missing(tmp_path):
    """RunState recomputes on KeyError; an untrusted artifact is an error with its code, not a cache miss."""
    store = ArtifactStore(tmp_path / "artifacts")
    path, marker = _plant(store, tmp_path)
    os.chmod(path, 0o666)
    with pytest.raises(ArtifactUntrusted):
        RunState(store).get("parsed_document", 5, "any fingerprint")
    assert not marker.exists()


def test_a_value_put_without_keep_is_held_for_the_run_only(tmp_path):
    state = RunState(ArtifactStore(tmp_path / "artifacts"))
    state.put("document_chunks", 4, "fp", ["a"], keep=False)
    assert state.get("document_chunks", 4, "fp") == ["a"]
    assert not (tmp_path / "artifacts" / "task-4").exists()
    with pytest.raises(KeyError):
        RunState(ArtifactStore(tmp_path / "artifacts")).get("document_chunks", 4, "fp")  # a re-execution remakes it
