"""Identity key files: write one owner-readable, read one back with one-line errors.

Format: a PKCS#8 PEM Ed25519 private key (what `openssl genpkey -algorithm ed25519` writes),
so operators can inspect and back it up with standard tools. The file must not be readable
by group or others: a node refuses to run with a key that other local users could copy.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from node.errors import CommandError
from protocol.identity import Identity


def write_key(path: Path, identity: Identity, *, force: bool = False) -> None:
    """Write `identity` to `path` with mode 0600; refuse to overwrite unless `force`."""
    if path.exists() and not force:
        raise CommandError(f"{path} already exists; pass --force to overwrite it")
    if path.exists() and path.is_dir():
        raise CommandError(f"{path} is a directory")
    pem = Ed25519PrivateKey.from_private_bytes(identity.private_bytes()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except FileNotFoundError:
        raise CommandError(f"cannot write {path}: directory {path.parent} does not exist") from None
    except OSError as exc:
        with contextlib.suppress(OSError):  # on a read-only disk the cleanup fails as well
            tmp.unlink(missing_ok=True)
        raise CommandError(f"cannot write {path}: {exc.strerror}") from None


def read_key(path: Path) -> Identity:
    """Load an identity; a missing, unsafe or malformed file raises a one-line CommandError."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CommandError(
            f"key file {path} does not exist (create one with: swarm-node keygen --out {path})"
        ) from None
    except OSError as exc:
        raise CommandError(f"cannot read key file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CommandError(f"key file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise CommandError(
            f"key file {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o});"
            f" run: chmod 600 {path}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read key file {path}: {exc.strerror}") from None
    if len(data) > 64 * 1024:
        raise CommandError(f"key file {path} is too large to be a key file")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CommandError(f"key file {path} is not a PEM Ed25519 private key ({reason})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CommandError(f"key file {path} holds a {type(key).__name__}, not an Ed25519 key")
    return Identity(key)
