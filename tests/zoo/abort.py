"""Broken: the factory kills its process with os.abort() (a native crash). The validator must end with
exit 2 and a one-line reason, never crash itself."""
import os


def make(vocab_size, hidden_size, *, dtype, device, seed):
    os.abort()
