"""The disk tier's directory (PROMPT_CACHE_DIR): what the tier may touch there, and nothing else.

The setting names a path an operator (or a volume mount, or whoever could write to /tmp first)
chose; the tier deletes files there, so it must never delete, chmod or read what it did not
write:

- Only its own directory. The path is opened once, without following a link (O_NOFOLLOW), and
  must be a directory owned by this process's effective user (root included: a folder another
  user owns is not taken) and private (0700). A directory that does not exist is made 0700; one
  of ours that is empty (a fresh volume) is made 0700; one that holds anything and is not
  private (a model folder, a home directory) is not taken. A directory that fails a check is
  refused with one error log line naming the check, and the cache runs without the disk tier
  (RAM only), as when a write fails: the sidecar starts, and the log says why (`Refused`).
- Never a link. Every file is opened, made, renamed and deleted relative to that open
  directory (`dir_fd`) and opened with O_NOFOLLOW, so a link planted inside, or the path
  swapped for a link after the check, is never followed.
- Only its own names: `<32 hex digits>.kv` (a conversation), `.tmp` (one being written) and
  `.del` (one being deleted), regular files owned by this user. Anything else in the directory
  is left alone, and counted in the tier's start line (`foreign`).

A deleted conversation (`discard`) is renamed to `.del` at once, so no lookup and no later
start can take it, and unlinked on a thread of its own: freeing a 200 MiB file's pages took
30-280 ms on the request path of the spill that replaced it (ext4, AMD EPYC), most of it
waiting for the kernel's writeback of those very pages.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import weakref
from pathlib import Path
from typing import BinaryIO

NAME = re.compile(r"[0-9a-f]{32}\.(kv|tmp|del)")
PRIVATE = 0o700


class Refused(Exception):
    """The directory is not one the tier may use; the message says which check failed."""


class Folder:
    """PROMPT_CACHE_DIR, open; every operation by name inside it, never following a link."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._uid = os.geteuid()
        self._doomed: list[str] = []  # `.del` names the deleting thread has yet to unlink
        self._lock = threading.Lock()
        self._deleting: threading.Thread | None = None
        try:
            path.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if os.path.islink(path):
                raise Refused("it is a symbolic link") from None
            if isinstance(exc, FileExistsError | NotADirectoryError):
                raise Refused("it is not a directory") from None
            raise
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        found = os.fstat(fd)
        if found.st_uid != self._uid:
            raise Refused(f"it is owned by uid {found.st_uid}, not this process's {self._uid}")
        if stat.S_IMODE(found.st_mode) & 0o077:
            if os.listdir(fd):
                raise Refused(
                    f"it is not private ({stat.S_IMODE(found.st_mode):o}) and holds files: "
                    "not a directory this tier made"
                )
            os.fchmod(fd, PRIVATE)  # empty: a new volume, taken

    def names(self) -> tuple[list[str], int]:
        """The tier's own files (regular, this user's, its names), and how many other
        entries the directory holds (left alone)."""
        own, foreign = [], 0
        for name in os.listdir(self.fd):
            if NAME.fullmatch(name) and self._regular(name):
                own.append(name)
            else:
                foreign += 1
        return own, foreign

    def open_read(self, name: str) -> BinaryIO:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{name} is not a regular file")
        return os.fdopen(fd, "rb")

    def create(self, name: str) -> BinaryIO:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.fdopen(os.open(name, flags, 0o600, dir_fd=self.fd), "wb")

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> int:
        """Delete one of the tier's files (unlink never follows a link); 1 if it was there."""
        if not NAME.fullmatch(name):
            return 0
        try:
            os.unlink(name, dir_fd=self.fd)
            return 1
        except OSError:
            return 0

    def discard(self, name: str) -> int:
        """Delete one of the tier's files off the caller's path: renamed to `.del` now (gone
        from the tier's names), unlinked by a thread that lives while there is any to unlink;
        1 if it was there."""
        if not NAME.fullmatch(name) or name.endswith(".del"):
            return 0
        doomed = name.rsplit(".", 1)[0] + ".del"
        try:
            os.replace(name, doomed, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            return self.remove(name)
        with self._lock:
            self._doomed.append(doomed)
            if self._deleting is None:
                self._deleting = threading.Thread(
                    target=self._delete, name="kv-disk-delete", daemon=True
                )
                self._deleting.start()
        return 1

    def settle(self) -> None:
        """Wait until every discarded file is unlinked."""
        with self._lock:
            thread = self._deleting
        if thread is not None:
            thread.join()

    def _delete(self) -> None:
        while True:
            with self._lock:
                if not self._doomed:
                    self._deleting = None
                    return
                name = self._doomed.pop(0)
            self.remove(name)

    def size(self, name: str) -> int:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size
        except OSError:
            return 0

    def mtime(self, name: str) -> float:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime
        except OSError:
            return 0.0

    def _regular(self, name: str) -> bool:
        try:
            found = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(found.st_mode) and found.st_uid == self._uid
