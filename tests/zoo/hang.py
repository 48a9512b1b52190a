"""Broken: the factory never returns (a stuck download or lock). The validator must end with exit 2 within
its timeout."""
import time


def make(vocab_size, hidden_size, *, dtype, device, seed):
    while True:
        time.sleep(1.0)
