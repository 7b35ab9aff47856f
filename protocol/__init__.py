"""Wire objects, canonical codec, signed envelopes and the pure protocol rules.

Nothing in this package does IO, reads a clock or starts a thread: time is passed in,
bytes and events come in, decisions and actions go out. It imports nothing of ours.
It re-exports nothing either: each module is imported by its own name, so importing
one rule does not load every other (and the package has no import edges of its own).

The code is organized as follows:
- admission/: the admission pipeline, what a peer does with every message it receives
- accounting.py: work accounting: dense assignment counters, and what a gap in them costs
- assignment.py: the sampling seed of a rollout, derived from who made it
- audit_queue.py: which sampled rollout a validator audits next
- audit_sample.py: audit sampling a producer cannot predict and anyone can check afterwards
- authority.py: who may judge rollouts: validator keys and trainer-signed delegations
- body_pull.py: the body-pull schedule: whom to ask for an admitted header's body, and when
- catch_up.py: catch-up (anti-entropy) and delivery accounting
- codec.py: canonical msgpack encoding of the wire objects, and the strict decoder
- content_id.py: the one content hash of the network (SHA-256)
- credit.py: what a producer's work is worth, from bodies someone holds
- envelope.py: signed envelopes: sealing, opening and checking; the replay guard
- errors.py: error classes, split by whose fault it was
- forwarding.py: what admission's actions mean at the GossipSub boundary
- fraud.py: fraud cases: a failed verdict accuses; only a re-run of the audit convicts
- fuzz.py: mutation fuzzing of the decoders
- hole_punch.py: which addresses a DCUtR hole punch may dial, and who pays for the rest
- identity.py: peer identity: an Ed25519 key, its libp2p peer id, signatures
- peer_score.py: a decaying score per peer, and bans below a threshold
- penalties.py: every penalty of the network in one table
- producer_cases.py: a validator's claim over a worker's window of records, re-checked
- rollout.py: rollout records: a signed header plus its body, and files of them
- reachability.py: AutoNAT by agreement: whom to ask (at random, one per subnet), what the answers add up to
- run_manifest.py: run releases signed by the run authority, and whether to adopt one
- schema.py: field types of the wire objects (`Spec`s)
- shard_schedule.py: which weight shard to request from which peer, and when to give up
- standing.py: a producer's standing from its audits so far
- verified.py: when a rollout counts as verified
- version_claims.py: claims of policy versions we have not heard of: who must back them
- weights_plan.py: which weight manifests to fetch to reach a version, fewest bytes first
- wire.py: the wire objects: frozen, slotted, self-validating dataclasses
"""
