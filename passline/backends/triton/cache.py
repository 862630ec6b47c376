"""A disk cache of generated kernel sources and of multi-kernel choices.

Entries live in a private directory (`$PASSLINE_CACHE_DIR`, default `~/.cache/passline`, mode 0700),
keyed by a hash of what the kernel was generated from. Writes are atomic (a temporary file, then a
rename); each source carries a checksum line, and an entry whose checksum fails is deleted and rebuilt.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from ...config import current_settings, environment_variable

_HEADER = "# passline kernel sha256="


def default_dir() -> Path:
    return Path(current_settings().cache_dir)


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


class KernelCache:
    def __init__(self, directory=None):
        self.dir = Path(directory) if directory else default_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.dir, 0o700)
        except OSError:
            pass
        self.hits = 0
        self.misses = 0
        self.rebuilt = 0

    def _write(self, path: Path, text: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=path.suffix)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def source_path(self, key: str) -> Path:
        return self.dir / f"k{key}.py"

    def get_source(self, key: str) -> Path | None:
        """The cached source file for `key`, or None (a corrupted entry is removed)."""
        path = self.source_path(key)
        try:
            text = path.read_text()
        except OSError:
            self.misses += 1
            return None
        first, _, body = text.partition("\n")
        if first != _HEADER + hashlib.sha256(body.encode()).hexdigest():
            path.unlink(missing_ok=True)
            self.rebuilt += 1
            self.misses += 1
            return None
        self.hits += 1
        return path

    def put_source(self, key: str, source: str) -> Path:
        path = self.source_path(key)
        self._write(path, _HEADER + hashlib.sha256(source.encode()).hexdigest() + "\n" + source)
        return path

    def get_choice(self, key: str) -> dict | None:
        try:
            return json.loads((self.dir / f"c{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put_choice(self, key: str, choice: dict) -> None:
        self._write(self.dir / f"c{key}.json", json.dumps(choice))

    def get_binary(self, key: str) -> dict | None:
        """The record of a compiled binary's place in Triton's cache (`compat.binary_record`), or None."""
        try:
            record = json.loads((self.dir / f"b{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def put_binary(self, key: str, record: dict) -> None:
        with contextlib.suppress(OSError):  # a read-only cache: loaded through Triton's own path next time
            self._write(self.dir / f"b{key}.json", json.dumps(record))


def interpreting(on: bool):
    """Within: Triton runs kernels in its CPU interpreter (it reads TRITON_INTERPRET both when a kernel
    module is loaded and when helper functions are called from a running kernel); afterwards the
    variable is exactly what the user had."""
    return environment_variable("TRITON_INTERPRET", "1") if on else contextlib.nullcontext()


def load_kernel(path: Path, fn_name: str, interpret: bool):
    """Import the kernel module at `path` (Triton reads the source from the file) and return the
    jitted function; under `interpret` it is built for Triton's CPU interpreter."""
    from .precompile import import_kernel

    return import_kernel(path, fn_name, lambda: interpreting(interpret))
