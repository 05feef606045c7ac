"""Writing outputs whole or not at all: every kvsim command that writes goes through here.

A file or folder is written under a temporary name beside its target and renamed onto the
target only when it is complete, so a reader (or a resumed sweep) sees the old content or the
whole new one, never half of it. A write that fails (a read-only folder, a full disk, a file-size
limit) removes its temporary and raises `WriteError`: one line naming the path and what failed,
which the CLI prints with exit code 2.

Temporary names: a folder ``<name>.partial-<pid>-<hex>``, a file
``.<stem>.partial-<pid>-<hex><suffix>`` (hidden, with the file's suffix), where pid is the
writing process. The writer holds an advisory lock (``flock``) on the temporary for as long as
it writes. A process killed while writing (``kill -9``, power loss) leaves its temporary
behind; the next write beside it removes it when it is **stale**: its pid is not a live process
on this machine and its lock is free. Both are asked, so a writer on another host of a shared
file system (its pid unknown here, its lock held) is left alone, and so is a live process that
happens to reuse the pid (its temporary is cleaned once that process is gone).

    from kvsim.atomic import AtomicFolder, write_file
    write_file(Path("plan.json"), text)                     # str, bytes, or a fill(tmp_path)
    with AtomicFolder(Path("report")) as tmp:                # filled, then renamed into place
        (tmp / "report.md").write_text(page)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from kvsim.errors import ConfigError
from kvsim.textio import one_line

try:
    import fcntl
except ImportError:  # Windows: stale temporaries are recognised by their pid alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "AtomicFolder",
    "WriteError",
    "check_writable",
    "os_reason",
    "remove_stale",
    "write_file",
]

T = TypeVar("T")
#: A temporary: ``[.]<stem>.<partial|old>-<pid>[-<hex>][<suffix>]`` (see `_temp_path`).
_TEMP = re.compile(
    r"^(?P<stem>.+?)\.(?P<kind>partial|old)-(?P<pid>\d+)(?:-[0-9a-f]+)?(?P<suffix>\.[A-Za-z0-9]+)?$"
)


class WriteError(ConfigError):
    """An output that cannot be written: a read-only or missing folder, a full disk."""


def os_reason(exc: BaseException) -> str:
    """Why an OSError happened, in a few words ('Permission denied', 'File too large').

    pyarrow's errors carry the system's reason only inside their message ('... Detail:
    [errno 27] File too large'); the errno there gives the same words as Python's own errors.
    """
    strerror = getattr(exc, "strerror", None)
    text = str(exc)
    found = re.search(r"\[errno (\d+)\]", text, flags=re.IGNORECASE)
    if found:
        return os.strerror(int(found.group(1)))
    if strerror:
        return str(strerror)
    return one_line(text) or type(exc).__name__


# -- temporaries -----------------------------------------------------------------------------------
def _temp_path(target: Path) -> Path:
    """A file's temporary: hidden, and with the target's suffix, so a checker that reads the
    temporary sees the file type it expects ('.p.partial-123-0a1b2c3d.toml' for 'p.toml')."""
    tag = f"partial-{os.getpid()}-{secrets.token_hex(4)}"
    return target.with_name(f".{target.stem}.{tag}{target.suffix}")


def _lock(fd: int) -> None:
    """Hold an exclusive advisory lock on `fd` (best effort: some file systems have none)."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we wrote: never call it stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM), or a platform without signals
        return True
    return True


def _lock_free(path: Path) -> bool:
    """True when nobody holds the lock on `path`; False when held or when it cannot be asked."""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held (EWOULDBLOCK), or no locks on this file system: leave it
        return False
    finally:
        os.close(fd)


def remove_stale(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the stale temporaries in `folder` (see the module docstring): those of `name`
    (a file's or a folder's), or of every name when None. Returns what it removed; never
    raises (a temporary that cannot be removed stays)."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _TEMP.match(entry.name)
        if found is None:
            continue
        stem = found.group("stem")
        if entry.name.startswith("."):  # a file's: the suffix is the target's
            target_name = stem[1:] + (found.group("suffix") or "")
        elif found.group("suffix"):
            continue  # not a name kvsim gives
        else:
            target_name = stem
        if name is not None and target_name != name:
            continue
        if found.group("kind") == "old" and not (folder / target_name).exists():
            continue  # the only copy of the previous results, from a rename cut short
        if _pid_alive(int(found.group("pid"))):
            continue
        path = Path(entry.path)
        if not _lock_free(path):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


# -- files -----------------------------------------------------------------------------------------
def write_file(
    path: str | os.PathLike[str],
    content: str | bytes | Callable[[Path], Any],
    *,
    what: str = "",
    overwrite: bool = True,
    make_parents: bool = False,
    check: Callable[[Path], T] | None = None,
) -> T | None:
    """Write `path` whole: `content` (text as UTF-8, bytes, or a callable that writes the file
    it is given) goes to a hidden temporary beside it, which `check` (if any) reads and may
    refuse by raising, and which then replaces `path`. Returns what `check` returned.

    Raises WriteError naming `path` (and `what`, e.g. 'the results table') when the folder is
    missing (unless `make_parents`), `path` is a folder, `path` exists and not `overwrite`, or
    the write fails; the temporary is removed on every failure, Ctrl-C included.
    """
    path = Path(path)
    doing = f"cannot write {what}" if what else "cannot write"
    if _is_dir(path):
        raise WriteError(f"{path}: is a folder; give a file name")
    if not overwrite and _exists(path):
        raise WriteError(f"{path}: already exists; pass --overwrite to replace it")
    parent = path.parent
    if make_parents:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError(f"{path}: cannot create its folder: {os_reason(exc)}") from None
    elif not _is_dir(parent):
        raise WriteError(f"{path}: folder {parent} does not exist; create it first")
    remove_stale(parent, path.name)
    tmp = _temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise WriteError(f"{path}: {doing}: {os_reason(exc)}") from None
    result = None
    try:
        try:
            _lock(fd)  # held while writing: the temporary is not stale
            if callable(content):
                content(tmp)  # the callable opens the file itself
            else:
                data = content.encode("utf-8") if isinstance(content, str) else content
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if check is not None:
                result = check(tmp)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise WriteError(f"{path}: {doing}: {os_reason(exc)}") from None
    except BaseException:
        _unlink(tmp)
        raise
    return result


def check_writable(folder: Path, what: str = "") -> None:
    """WriteError unless a file can be created in `folder` now (a read-only folder, a full
    inode table): asked before long work whose results go there."""
    remove_stale(folder, "write-test")  # a probe of a process killed in between
    probe = _temp_path(folder / "write-test")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        where = f" {what}" if what else ""
        raise WriteError(f"{folder}: cannot write{where} there: {os_reason(exc)}") from None
    os.close(fd)
    _unlink(probe)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


# -- folders ---------------------------------------------------------------------------------------
class AtomicFolder:
    """A folder written whole: filled in a temporary sibling, renamed onto `out` when complete.

    Creating one checks the target (`check_target`), creates the missing parent folders and
    the temporary sibling ``tmp`` (so an unwritable place fails before any long work), and
    removes stale temporaries of `out` left by killed writers. `commit` renames ``tmp`` onto
    `out`: onto a missing or empty folder always; onto a non-empty one only with `overwrite`
    (after `check_target` again), the old folder set aside until the new one is in place. When
    another writer filled `out` meanwhile and not `overwrite`, the results are kept beside, under
    the first free ``<out>-N``, and WriteError says where. `discard` removes ``tmp`` and the
    parent folders this created. As a context manager it commits on success and discards on
    any exception, an OSError becoming WriteError.

    Subclasses refine `check_target` (which files a folder may hold to be replaced).
    """

    what = "the folder"  # in messages: 'cannot create <what> there'

    def __init__(self, out: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.out = Path(out)
        self.overwrite = overwrite
        self.check_target()
        parent = self.out.parent
        self._made: list[Path] = []  # parent folders this created, removed again by discard
        missing = parent
        while not _exists(missing) and missing != missing.parent:
            self._made.append(missing)
            missing = missing.parent
        self._fd = -1
        try:
            parent.mkdir(parents=True, exist_ok=True)
            remove_stale(parent, self.out.name)
            self.tmp = fresh_dir(parent, f"{self.out.name}.partial-")
        except OSError as exc:
            self._remove_made()
            raise WriteError(
                f"{self.out}: cannot create {self.what} there: {os_reason(exc)}"
            ) from None
        with contextlib.suppress(OSError):
            self._fd = os.open(self.tmp, os.O_RDONLY)
            _lock(self._fd)

    # -- the target --------------------------------------------------------------------------------
    def check_target(self) -> None:
        """Refuse a target that is a file, or a non-empty folder without `overwrite`."""
        out = self.out
        if _exists(out) and not _is_dir(out):
            raise WriteError(f"{out}: is a file, not a folder; give a folder")
        entries = self.entries()
        if entries and not self.overwrite:
            raise WriteError(f"{out}: folder is not empty; pass --overwrite to replace it")

    def entries(self) -> list[str]:
        """The names in the target folder, sorted ([] when it does not exist)."""
        if not _is_dir(self.out):
            return []
        try:
            return sorted(e.name for e in self.out.iterdir())
        except OSError as exc:
            raise WriteError(f"{self.out}: cannot read the folder: {os_reason(exc)}") from None

    # -- filling -----------------------------------------------------------------------------------
    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.commit()
            return
        self.discard()
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"{self.out}: cannot write: {os_reason(exc)}") from None

    def fill(self, write: Callable[[Path], Any], failed: str = "cannot write") -> Path:
        """Call ``write(tmp)``, then `commit`; on an OSError discard and raise WriteError
        ('<out>: <failed>: <reason>'); on any other exception discard and re-raise."""
        try:
            write(self.tmp)
        except OSError as exc:
            self.discard()
            raise WriteError(f"{self.out}: {failed}: {os_reason(exc)}") from None
        except BaseException:
            self.discard()
            raise
        self.commit()
        return self.out

    # -- putting it in place ---------------------------------------------------------------------
    def commit(self) -> Path:
        """Rename the filled temporary folder onto `out` (see the class docstring)."""
        try:
            self._install()
        finally:
            self._unlock()
        return self.out

    def _install(self) -> None:
        try:
            os.rename(self.tmp, self.out)  # onto a missing or empty folder only
            return
        except OSError as exc:
            taken = exc.errno in (errno.ENOTEMPTY, errno.EEXIST)
            if not taken or not self.overwrite:
                aside = self._aside()
                why = (
                    "another run wrote its results there while this one ran"
                    if taken
                    else f"cannot move the results into place: {os_reason(exc)}"
                )
                raise WriteError(f"{self.out}: {why}; this run's results are in {aside}") from None
        self.check_target()  # still only what may be replaced, or refuse
        try:
            old = fresh_dir(self.out.parent, f"{self.out.name}.old-")
            os.rename(self.out, old)  # the previous folder, aside until the new one is in
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                old.rmdir()
            aside = self._aside()
            raise WriteError(
                f"{self.out}: cannot replace the folder ({os_reason(exc)}); this run's "
                f"results are in {aside}"
            ) from None
        try:
            os.rename(self.tmp, self.out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rename(old, self.out)  # put the previous folder back
            aside = self._aside()
            raise WriteError(
                f"{self.out}: cannot replace the folder ({os_reason(exc)}); this run's "
                f"results are in {aside}"
            ) from None
        shutil.rmtree(old, ignore_errors=True)

    def _aside(self) -> Path:
        """Move the finished temporary folder to the first free ``<out>-N`` and return it."""
        for n in range(2, 1001):
            aside = self.out.with_name(f"{self.out.name}-{n}")
            if not _exists(aside):
                try:
                    os.rename(self.tmp, aside)
                    return aside
                except OSError:
                    pass
        return self.tmp

    def discard(self) -> None:
        """Remove the temporary folder (and any parent folders this created)."""
        self._unlock()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._remove_made()

    def _unlock(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _remove_made(self) -> None:
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:
                break


def fresh_dir(parent: Path, prefix: str) -> Path:
    """A new empty folder ``<parent>/<prefix><pid>-<random>``, with the user's umask (unlike
    tempfile.mkdtemp's 0700, which the folder would keep after its rename)."""
    while True:
        path = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
