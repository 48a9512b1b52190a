"""Implementations of PIT written for the validator's tests: correct ones in several conventions and
broken ones with one realistic bug each. Every public module here (no leading underscore) exposes
`make(vocab_size, hidden_size, *, dtype, device, seed)`; `_base.py` is the plain L L^T module the
broken ones start from (itself correct), so each broken file differs from it by its one bug.
"""
