"""The audit room: checkpoints and heads of the hash chain, proofs, verification, the witness."""
