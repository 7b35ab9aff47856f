"""Run releases: the run manifest signed by its run authority, and whether to adopt one.

A release is a `protocol.wire.RunRelease` (the manifest, its `manifest_version`, the
authority's peer id) sealed in an `Envelope` by the authority's key (`seal_release`): the
envelope names the manifest's run, its `seq` is the manifest version. Every peer serves the
release it holds; a peer started from an unsigned run file serves the bare encoded
`RunManifest`, which joiners refuse as unsigned.

`check(data, pinned, current)` decides, with no IO:

- `Refuse(MALFORMED)`: not a run release (garbage, another kind, fields that disagree);
- `Refuse(UNSIGNED)`: a bare manifest, no signature at all;
- `Refuse(BAD_SIGNATURE)`: the signature does not verify;
- `Refuse(FOREIGN)`: signed, but not by the pinned authority (nor by the authority of the
  release we hold);
- `Refuse(OTHER_RUN)`: a release of another run than the one we hold;
- `Refuse(NOT_NEWER)`: a version older than or equal to the one we hold;
- `Adopt(release, first_use)`: otherwise; `first_use` when nothing pinned the authority
  (trust on first use: the caller records `release.authority` and says so loudly).

`choose_pin(flag, remembered)` is the trust-on-first-use table: the authority given on the
command line, the one remembered from an earlier join, both (they must agree), or neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.codec import decode, encode
from protocol.envelope import open_envelope, seal
from protocol.errors import DecodeError, LocalProtocolError, SignatureError
from protocol.identity import Identity, peer_id_to_b58
from protocol.wire import Envelope, RunManifest, RunRelease

__all__ = [
    "BAD_SIGNATURE",
    "FOREIGN",
    "MALFORMED",
    "NOT_NEWER",
    "OTHER_RUN",
    "UNSIGNED",
    "Adopt",
    "Pin",
    "Refuse",
    "assemble",
    "check",
    "choose_pin",
    "encode_unsigned",
    "parts",
    "seal_release",
]

MALFORMED = "malformed"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad signature"
FOREIGN = "foreign-signed"
OTHER_RUN = "other run"
NOT_NEWER = "not newer"


@dataclass(frozen=True)
class Adopt:
    """Take this release: it is the run's manifest from now on."""

    release: RunRelease
    first_use: bool = False


@dataclass(frozen=True)
class Refuse:
    """Keep what we hold; `reason` is one of the module's reason names, `detail` says more."""

    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class Pin:
    """The authority to require (None: trust on first use)."""

    authority: bytes | None


def seal_release(
    authority: Identity, manifest: RunManifest, manifest_version: int, timestamp_ms: int
) -> bytes:
    """The envelope bytes of `manifest` released as `manifest_version` by `authority`."""
    release = RunRelease(
        manifest=manifest, manifest_version=manifest_version, authority=authority.peer_id
    )
    return seal(
        authority,
        release,
        run_id=manifest.run_id,
        policy_version=0,
        seq=manifest_version,
        timestamp_ms=timestamp_ms,
    )


def assemble(
    manifest: RunManifest,
    manifest_version: int,
    authority: bytes,
    timestamp_ms: int,
    signature: bytes,
) -> bytes:
    """The envelope bytes of a release kept in parts (a run file keeps the manifest as
    TOML and only the version, authority, time and signature beside it). Unchecked: pass
    the result to `check`. Raises `LocalProtocolError` for parts out of shape."""
    release = RunRelease(manifest=manifest, manifest_version=manifest_version, authority=authority)
    env = Envelope(
        kind=RunRelease.KIND,
        signer=authority,
        run_id=manifest.run_id,
        policy_version=0,
        seq=manifest_version,
        timestamp_ms=timestamp_ms,
        payload=encode(release),
        signature=signature,
    )
    return encode(env)


def parts(data: bytes) -> tuple[int, bytes, int, bytes]:
    """(manifest version, authority, timestamp_ms, signature) of release envelope bytes."""
    env = decode(Envelope, data)
    return env.seq, env.signer, env.timestamp_ms, env.signature


def _open(data: bytes) -> RunRelease | Refuse:
    """The release inside `data`, or why it is not one (signature checked, pin not)."""
    if not isinstance(data, bytes) or not data:
        return Refuse(UNSIGNED, "no manifest at all")
    try:
        env, release = open_envelope(data, RunRelease)
    except SignatureError as exc:
        return Refuse(BAD_SIGNATURE, str(exc))
    except (DecodeError, LocalProtocolError) as exc:
        try:
            bare = decode(RunManifest, data)
        except (DecodeError, LocalProtocolError):
            return Refuse(MALFORMED, f"not a run release ({exc})")
        return Refuse(UNSIGNED, f"run {bare.run_id!r} is served without the authority's signature")
    if env.signer != release.authority:
        return Refuse(FOREIGN, "signed by a key other than the authority it names")
    if env.run_id != release.manifest.run_id or env.seq != release.manifest_version:
        return Refuse(MALFORMED, "the envelope's run or sequence differs from the release inside")
    return release


def check(data: bytes, pinned: bytes | None, current: RunRelease | None) -> Adopt | Refuse:
    """Whether to adopt the release in `data` (see the module docstring)."""
    opened = _open(data)
    if isinstance(opened, Refuse):
        return opened
    release = opened
    required = pinned if pinned is not None else (current.authority if current else None)
    if required is not None and release.authority != required:
        return Refuse(
            FOREIGN,
            f"signed by {peer_id_to_b58(release.authority)}, the run's authority is "
            f"{peer_id_to_b58(required)}",
        )
    if current is not None:
        if release.manifest.run_id != current.manifest.run_id:
            return Refuse(
                OTHER_RUN, f"run {release.manifest.run_id!r}, we hold {current.manifest.run_id!r}"
            )
        if release.manifest_version <= current.manifest_version:
            return Refuse(
                NOT_NEWER,
                f"version {release.manifest_version}, we hold {current.manifest_version}",
            )
    return Adopt(release, first_use=required is None)


def choose_pin(flag: bytes | None, remembered: bytes | None) -> Pin | Refuse:
    """The authority to require: the flag's, else the remembered one, else none (trust on
    first use). A flag that contradicts what this node pinned before is refused: trusting
    another authority is a decision the operator makes by removing the pin."""
    if flag is not None and remembered is not None and flag != remembered:
        return Refuse(
            FOREIGN,
            f"--authority {peer_id_to_b58(flag)} differs from the authority this node pinned "
            f"before, {peer_id_to_b58(remembered)}",
        )
    return Pin(flag if flag is not None else remembered)


def encode_unsigned(manifest: RunManifest) -> bytes:
    """What a peer without a release serves: the bare manifest (joiners refuse it)."""
    return encode(manifest)
