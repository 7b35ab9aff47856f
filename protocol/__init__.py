"""Wire objects, canonical codec, signed envelopes and the pure protocol rules.

Nothing in this package does IO, reads a clock or starts a thread: time is passed in,
bytes and events come in, decisions and actions go out. It imports nothing of ours.
"""
