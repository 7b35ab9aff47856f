"""The wire objects of the network: frozen, slotted, self-validating dataclasses.

Each declares its kind (the domain-separation tag when signed), its schema version and its
byte limit; `protocol.codec` encodes them canonically. Which objects travel signed inside an
`Envelope` (see `protocol.envelope`): RunManifest and RunRelease (by the run authority), RolloutHeader,
Verdict, FraudEvidence, WeightManifest (by a trainer key) and PeerHello. RolloutBody travels
beside its signed header, bound to it by `RolloutHeader.body_digest`; shard bytes are bound
by the per-shard digests of the signed WeightManifest.

Limits are set for the largest legitimate object with room to spare, and checked before
decoding: a rollout of up to 16,384 prompt and 16,384 completion tokens, proofs of up to
k = 1,024 coefficients, shards of up to 64 MiB.
"""

from __future__ import annotations

import string

from protocol.codec import Nested, WireObject, spec, wire
from protocol.identity import SIGNATURE_SIZE
from protocol.schema import (
    U16,
    U32,
    U63,
    U64,
    Bool,
    Bytes,
    F32Array,
    Float,
    Int,
    ListOf,
    PeerId,
    Str,
    U32Array,
)

KiB = 1024
MiB = 1024 * KiB

MAX_PROMPT_TOKENS = 16_384
MAX_COMPLETION_TOKENS = 16_384
MAX_PROOF_BYTES = 2 + 2 * 1024
MAX_SHARD_BYTES = 64 * MiB
DIGEST = Bytes(32, sizes=(32,))
OPTIONAL_DIGEST = Bytes(32, sizes=(0, 32))
# Compute precisions a run may fix for its workers (see verify.auditor: one regime each)
WORKER_PRECISIONS = ("fp32", "bf16")
# dtypes a run may publish its policy versions in (trainer.checkpoint.from_state_dict)
WEIGHT_DTYPES = ("float32", "bfloat16")
NAME_CHARS = string.ascii_lowercase + string.digits + "-_."
RUN_ID = Str(64, min_len=1, charset=NAME_CHARS)
ROLES = ("inference", "trainer", "validator", "relay")


@wire("dataset_spec", schema=1, max_bytes=1 * KiB)
class DatasetSpec(WireObject):
    """One task dataset of a run and its integer share of the task mix."""

    name: str = spec(Str(64, min_len=1, charset=NAME_CHARS))
    weight: int = spec(Int(1, 1_000_000))


@wire("run_manifest", schema=1, max_bytes=64 * KiB)
class RunManifest(WireObject):
    """What a training run is: model, tasks, sampling, proof and RL settings, trainer keys."""

    run_id: str = spec(RUN_ID)
    model: str = spec(Str(256, min_len=1))
    model_digest: bytes = spec(OPTIONAL_DIGEST)
    datasets: tuple[DatasetSpec, ...] = spec(ListOf(Nested(DatasetSpec), 64, min_len=1))
    seed: int = spec(Int(*U63))
    group_size: int = spec(Int(1, 1024))
    max_staleness: int = spec(Int(*U16))
    max_new_tokens: int = spec(Int(1, MAX_COMPLETION_TOKENS))
    temperature: float = spec(Float(0.0, 10.0))
    top_p: float = spec(Float(0.0, 1.0))
    top_k: int = spec(Int(*U32))
    proof_chunk: int = spec(Int(1, 4096))
    proof_topk: int = spec(Int(1, 1024))
    trainer_keys: tuple[bytes, ...] = spec(ListOf(PeerId(), 16))
    # -- weight broadcast --
    snapshot_every: int = spec(Int(1, 1_000_000), default=8)  # K: a full snapshot every K versions
    # Trust (who may judge, how many must agree; see protocol.authority, protocol.verified).
    validator_keys: tuple[bytes, ...] = spec(ListOf(PeerId(), 64), default=())
    verdict_quorum: int = spec(Int(1, 64), default=1)
    # RL settings (trainer.loss, trainer.train_loop), TOML section [rl]; kept together.
    rl_advantage: str = spec(Str(8, choices=("mean", "std")), default="mean")
    rl_aggregation: str = spec(Str(8, choices=("token", "sequence")), default="token")
    rl_clip_low: float = spec(Float(0.0, 0.99), default=0.2)
    rl_clip_high: float = spec(Float(0.0, 10.0), default=0.28)
    rl_is_bound: float = spec(Float(0.0, 1000.0), default=2.0)  # 0 = no importance correction
    rl_kl_coef: float = spec(Float(0.0, 100.0), default=0.0)
    rl_lr: float = spec(Float(1e-9, 1.0), default=3e-4)
    rl_groups_per_step: int = spec(Int(1, 4096), default=16)
    rl_publish_every: int = spec(Int(1, 1_000_000), default=64)  # verified groups per version
    # -- verification: the workers' compute precision; audits judge at it only
    worker_precision: str = spec(Str(8, choices=WORKER_PRECISIONS), default="fp32")
    # content id of the model's calibration file (verify.calibration); b"" = not pinned
    calibration_digest: bytes = spec(OPTIONAL_DIGEST, default=b"")
    # -- fields below are on the wire only when not at their default (protocol.codec) --
    # the dtype policy versions are published in: "float32" = the trainer's weights as held
    # (its fp32 master), "bfloat16" = floating tensors cast from the master at each publish
    weights_dtype: str = spec(Str(16, choices=WEIGHT_DTYPES), default="float32", omit_default=True)
    # content id of the model directory's other files (config, tokenizer, calibration;
    # protocol.model_bundle), which a joining peer fetches from the run; b"" = not pinned
    model_files_digest: bytes = spec(OPTIONAL_DIGEST, default=b"", omit_default=True)


@wire("run_release", schema=1, max_bytes=64 * KiB)
class RunRelease(WireObject):
    """A run manifest as its run authority released it: each update has a higher
    `manifest_version`; `authority` is the key that signs every release of the run
    (`protocol.run_manifest` has the rules)."""

    manifest: RunManifest = spec(Nested(RunManifest))
    manifest_version: int = spec(Int(1, 2**63 - 1))
    authority: bytes = spec(PeerId())


@wire("rollout_header", schema=1, max_bytes=2 * KiB)
class RolloutHeader(WireObject):
    """The small, signed, gossiped part of a rollout. The body is bound by its digest.

    The task is re-derivable by anyone from (run seed, producer, counter);
    `task_seed` is that derivation's output, also the sampler's seed.
    """

    dataset: str = spec(Str(64, min_len=1, charset=NAME_CHARS))
    task_index: int = spec(Int(*U63))
    counter: int = spec(Int(*U63))
    task_seed: int = spec(Int(*U64))
    reward: float = spec(Float(-1e6, 1e6))
    n_prompt: int = spec(Int(0, MAX_PROMPT_TOKENS))
    n_completion: int = spec(Int(0, MAX_COMPLETION_TOKENS))
    body_digest: bytes = spec(DIGEST)
    body_size: int = spec(Int(1, 4 * MiB))


@wire("rollout_body", schema=1, max_bytes=4 * MiB)
class RolloutBody(WireObject):
    """Tokens, the sampler's per-token log-probs, sampling settings and activation proofs."""

    prompt_ids: tuple[int, ...] = spec(U32Array(MAX_PROMPT_TOKENS))
    completion_ids: tuple[int, ...] = spec(U32Array(MAX_COMPLETION_TOKENS))
    logprobs: tuple[float, ...] = spec(F32Array(MAX_COMPLETION_TOKENS, lo=-1e4, hi=0.0))
    temperature: float = spec(Float(0.0, 10.0))
    top_p: float = spec(Float(0.0, 1.0))
    top_k: int = spec(Int(*U32))
    max_new_tokens: int = spec(Int(1, MAX_COMPLETION_TOKENS))
    sampling_seed: int = spec(Int(*U64))
    finish_reason: str = spec(Str(8, choices=("eos", "length")))
    proofs: tuple[bytes, ...] = spec(
        ListOf(Bytes(MAX_PROOF_BYTES), MAX_COMPLETION_TOKENS // 32 + 1)
    )


@wire("rollout_record", schema=1, max_bytes=4 * MiB + 4 * KiB)
class RolloutRecord(WireObject):
    """A signed header envelope and its body, as stored, pulled and written to files."""

    header: bytes = spec(Bytes(4 * KiB, min_len=1))
    body: bytes = spec(Bytes(4 * MiB, min_len=1))


MAX_HEADER_BATCH = 64  # signed headers per gossip message


@wire("header_batch", schema=1, max_bytes=MAX_HEADER_BATCH * 4 * KiB + 1 * KiB)
class HeaderBatch(WireObject):
    """Several signed rollout header envelopes in one gossip message (unsigned framing).

    Batching only saves per-message cost (GossipSub framing, pacing, validation calls):
    each header inside is still its producer's signed envelope and is admitted on its
    own, exactly as if it had arrived alone; the batch itself carries no authority.
    """

    headers: tuple[bytes, ...] = spec(
        ListOf(Bytes(4 * KiB, min_len=1), MAX_HEADER_BATCH, min_len=1)
    )


@wire("metric", schema=1, max_bytes=256)
class Metric(WireObject):
    """A named number (an audit's or a run's measurement)."""

    name: str = spec(Str(64, min_len=1))
    value: float = spec(Float(-1e300, 1e300))


@wire("verdict", schema=1, max_bytes=8 * KiB)
class Verdict(WireObject):
    """A validator's signed judgement of one rollout, with its reason and measurements."""

    rollout_id: bytes = spec(DIGEST)
    producer: bytes = spec(PeerId())
    passed: bool = spec(Bool())
    reason: str = spec(Str(64, min_len=1, charset=NAME_CHARS))
    reward_rescored: float = spec(Float(-1e6, 1e6))
    metrics: tuple[Metric, ...] = spec(ListOf(Nested(Metric), 64))
    # The validator's audit-sample ticket for this rollout (protocol.audit_sample): its own
    # deterministic signature over the rollout id; empty when the audit was not sampled.
    sample_ticket: bytes = spec(Bytes(SIGNATURE_SIZE, sizes=(0, SIGNATURE_SIZE)), default=b"")


# The largest window a producer claim may name (verify.producer.WINDOW is 16).
MAX_CLAIM_RECORDS = 64


@wire("producer_claim", schema=1, max_bytes=4 * KiB)
class ProducerClaim(WireObject):
    """A validator's signed claim that `producer`'s window of audited records has a window
    statistic (`protocol.producer_cases.window_statistic`, carried in `median`)
    `statistic` over `limit` (`verify.producer`). The evidence is the records themselves,
    which the producer signed and any peer pulls by id: a re-check audits every one of
    them and takes the window statistic itself, against its own copy of the run's limit."""

    producer: bytes = spec(PeerId())
    rollout_ids: tuple[bytes, ...] = spec(ListOf(DIGEST, MAX_CLAIM_RECORDS, min_len=1))
    statistic: str = spec(Str(64, min_len=1, charset=NAME_CHARS))
    median: float = spec(Float(0.0, 1e6))
    limit: float = spec(Float(0.0, 1e6))


@wire("delegation", schema=1, max_bytes=1 * KiB)
class Delegation(WireObject):
    """A trainer key's grant (or revocation) of the right to judge rollouts to `validator`.

    The newest delegation of a validator (by the envelope's timestamp, then seq) wins.
    """

    validator: bytes = spec(PeerId())
    granted: bool = spec(Bool())


@wire("fraud_evidence", schema=1, max_bytes=4 * MiB + 16 * KiB)
class FraudEvidence(WireObject):
    """The accused rollout record itself, so any peer can re-run the audit that failed it."""

    record: bytes = spec(Bytes(4 * MiB + 4 * KiB, min_len=1))
    reason: str = spec(Str(64, min_len=1, charset=NAME_CHARS))
    detail: str = spec(Str(1024))
    metrics: tuple[Metric, ...] = spec(ListOf(Nested(Metric), 64))


@wire("shard_info", schema=1, max_bytes=256)
class ShardInfo(WireObject):
    """One shard of a weights file: its index, byte offset, size and digest."""

    index: int = spec(Int(*U32))
    offset: int = spec(Int(*U63))
    size: int = spec(Int(1, MAX_SHARD_BYTES))
    digest: bytes = spec(DIGEST)


@wire("weight_manifest", schema=1, max_bytes=4 * MiB)
class WeightManifest(WireObject):
    """A policy version as shards: full snapshot, or delta patch anchored on a base version."""

    version: int = spec(Int(*U32))
    kind: str = spec(Str(8, choices=("full", "delta")))
    base_version: int = spec(Int(*U32))
    base_digest: bytes = spec(OPTIONAL_DIGEST)
    total_bytes: int = spec(Int(*U63))
    file_digest: bytes = spec(DIGEST)
    shards: tuple[ShardInfo, ...] = spec(ListOf(Nested(ShardInfo), 65_536, min_len=1))


@wire("shard_request", schema=1, max_bytes=256)
class ShardRequest(WireObject):
    """A request for shard `index` of the manifest with digest `manifest_digest`."""

    manifest_digest: bytes = spec(DIGEST)
    index: int = spec(Int(*U32))


@wire("shard_response", schema=1, max_bytes=MAX_SHARD_BYTES + 1 * KiB)
class ShardResponse(WireObject):
    """The bytes of shard `index` of the manifest with digest `manifest_digest`."""

    manifest_digest: bytes = spec(DIGEST)
    index: int = spec(Int(*U32))
    data: bytes = spec(Bytes(MAX_SHARD_BYTES))


@wire("peer_hello", schema=1, max_bytes=8 * KiB)
class PeerHello(WireObject):
    """What a peer says about itself when it connects."""

    roles: tuple[str, ...] = spec(ListOf(Str(16, choices=ROLES), 4, min_len=1))
    policy_version: int = spec(Int(*U32))
    listen_addrs: tuple[str, ...] = spec(ListOf(Str(256, min_len=1), 16))
    agent: str = spec(Str(64))


@wire("envelope", schema=1, max_bytes=4 * MiB + 64 * KiB)
class Envelope(WireObject):
    """A signed object: who, for which run and version, in which order, when, and what.

    `payload` is the canonical encoding of the object of kind `kind`. The signature covers
    a domain-separation prefix naming the kind and every other field (`protocol.envelope`).
    """

    kind: str = spec(Str(32, min_len=1))
    signer: bytes = spec(PeerId())
    run_id: str = spec(RUN_ID)
    policy_version: int = spec(Int(*U32))
    seq: int = spec(Int(*U63))
    timestamp_ms: int = spec(Int(*U63))
    payload: bytes = spec(Bytes(4 * MiB + 32 * KiB, min_len=1))
    signature: bytes = spec(Bytes(SIGNATURE_SIZE, sizes=(SIGNATURE_SIZE,)))


SIGNED_KINDS: dict[str, type[WireObject]] = {
    cls.KIND: cls
    for cls in (
        RunManifest,
        RunRelease,
        RolloutHeader,
        Verdict,
        Delegation,
        FraudEvidence,
        ProducerClaim,
        WeightManifest,
        PeerHello,
    )
}

ALL_OBJECTS: tuple[type[WireObject], ...] = (
    DatasetSpec,
    RunManifest,
    RunRelease,
    RolloutHeader,
    RolloutBody,
    RolloutRecord,
    Metric,
    Verdict,
    Delegation,
    FraudEvidence,
    ShardInfo,
    WeightManifest,
    ShardRequest,
    ShardResponse,
    PeerHello,
    Envelope,
)
