"""One checkpoint directory of a run as a tar stream (GET /api/runs/{id}/checkpoints/{name}): written as it is read,
a MiB at a time, so a checkpoint of many GiB never sits in the API's memory.

A checkpoint's name is `<stage>-checkpoint-<step>` (the `name` of GET /api/runs/{id}/checkpoints), for the
directory RUN_DIR/checkpoints/<stage>/checkpoint-<step>. The path is built from the name's two parts, never joined
from what the client sent, and it must resolve inside the run's checkpoints directory (a symlink out of it is
refused as missing). Symlinks inside the checkpoint go into the tar as links, not followed."""
from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

from backend.core.errors import UserError

NAME = re.compile(r"^(stage\d{1,4})-checkpoint-(\d{1,12})$")
CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE


def checkpoint_name(stage: str, step: int) -> str:
    return f"{stage}-checkpoint-{step}"


def checkpoint_dir(run_dir: str | None, name: str) -> Path:
    """The checkpoint directory `name` names under the run's directory; 404 naming the checkpoint otherwise."""
    m = NAME.match(name)
    missing = UserError(404, "name", f"checkpoint {name!r} does not exist"
                        + ("" if m else " (names read <stage>-checkpoint-<step>, as GET /api/runs/{id}/checkpoints "
                                        "lists them)"))
    if m is None or not run_dir:
        raise missing
    root = (Path(run_dir) / "checkpoints").resolve()
    path = root / m.group(1) / f"checkpoint-{m.group(2)}"
    try:
        real = path.resolve(strict=True)
    except OSError:
        raise missing from None
    if not real.is_relative_to(root) or not real.is_dir():
        raise missing
    return real


def tar_stream(directory: Path, arcname: str) -> Iterator[bytes]:
    """A ustar/PAX tar of `directory` under `arcname`/, in sorted order, produced as it is read."""
    for path in [directory, *sorted(directory.rglob("*"))]:
        rel = arcname if path == directory else f"{arcname}/{path.relative_to(directory).as_posix()}"
        info = tarfile.TarInfo(rel)
        st = path.lstat()
        info.mtime, info.mode = int(st.st_mtime), st.st_mode & 0o7777
        if path.is_symlink():
            info.type, info.linkname = tarfile.SYMTYPE, str(path.readlink())
        elif path.is_dir():
            info.type = tarfile.DIRTYPE
        elif path.is_file():
            info.size = st.st_size
        else:
            continue  # sockets, fifos: nothing a checkpoint holds
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        if info.type == tarfile.REGTYPE:
            sent = 0
            with path.open("rb") as f:
                while sent < info.size and (chunk := f.read(min(CHUNK, info.size - sent))):
                    sent += len(chunk)
                    yield chunk
            if sent < info.size:  # shrank while being read: the header promised the size
                yield bytes(info.size - sent)
            if info.size % BLOCK:
                yield bytes(BLOCK - info.size % BLOCK)
    yield bytes(2 * BLOCK)  # the end-of-archive marker
