"""Real text for the lm gradient source: CPython's documentation topics, a held-out split and a byte-level
BPE vocabulary of any size from 256 (the bytes alone) up, learned from the training split only.

`pydoc_data.topics.topics` ships with every CPython (about 465k characters of English in ~80 topics).
The last tenth of every topic (cut at a line break) is held out: held-out loss measures text the model
never saw, from every topic (whole topics held out would give a few small ones by chance). The text differs between
Python versions: the corpus's SHA-256 goes into every run's manifest.
"""
from __future__ import annotations

import functools
import hashlib
import heapq
import re
import unicodedata
from collections import Counter
from pathlib import Path
from dataclasses import dataclass

import numpy as np

from ...infra.errors import PitcheckError

MIN_VOCAB, MAX_VOCAB = 256, 8192
HELDOUT_FRACTION = 0.1
# chunks never merged across: a word with the space before it, a number, a run of punctuation, whitespace
CHUNK = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


def topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics as table
    except ImportError:  # pragma: no cover - part of CPython; some distributions split it out
        raise PitcheckError("the lm source needs pydoc_data.topics (CPython's documentation text), "
                            "which this Python lacks") from None
    return dict(table)


def split_text() -> tuple[str, str]:
    """(training text, held-out text): topics in name order, each cut at the first line break after 90%."""
    table = topics()
    train, held = [], []
    for name in sorted(table):
        text = table[name]
        cut = text.find("\n", int(len(text) * (1 - HELDOUT_FRACTION)))
        cut = len(text) if cut < 0 else cut
        train.append(text[:cut])
        held.append(text[cut:])
    return "\n".join(train), "\n".join(held)


def chunks(text: str) -> list[bytes]:
    return [m.encode("utf-8") for m in CHUNK.findall(text)]


def learn_merges(words: Counter, merges: int) -> list[tuple[int, int]]:
    """Byte-pair merges learned from chunk counts: each time the most frequent adjacent pair (ties: the
    smallest pair) becomes a new token. Pair counts are updated only in the chunks a merge touches."""
    seqs = [list(w) for w in words]
    freq = list(words.values())
    counts: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = {}
    for i, s in enumerate(seqs):
        for pair in zip(s, s[1:]):
            counts[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    out: list[tuple[int, int]] = []
    while len(out) < merges:
        while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)  # a stale entry: its pair's count has changed since it was pushed
        if not heap:
            raise PitcheckError(f"the training text supports a vocabulary of at most {256 + len(out)} tokens")
        _, pair = heapq.heappop(heap)
        new = 256 + len(out)
        out.append(pair)
        changed: set[tuple[int, int]] = set()
        for i in sorted(where.pop(pair, ())):
            s, f = seqs[i], freq[i]
            for p in zip(s, s[1:]):
                counts[p] -= f
                changed.add(p)
            merged, k = [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == pair[0] and s[k + 1] == pair[1]:
                    merged.append(new)
                    k += 2
                else:
                    merged.append(s[k])
                    k += 1
            seqs[i] = merged
            for p in zip(merged, merged[1:]):
                counts[p] += f
                changed.add(p)
                where.setdefault(p, set()).add(i)
        counts.pop(pair, None)
        for p in changed:
            c = counts.get(p, 0)
            if c <= 0:
                counts.pop(p, None)
            elif p != pair:
                heapq.heappush(heap, (-c, p))
    return out


@dataclass(frozen=True)
class Corpus:
    vocab: int
    train: np.ndarray  # token ids, int64
    heldout: np.ndarray
    pieces: tuple  # bytes of every token id
    text_sha256: str
    vocabulary: str = "bpe"
    rows: tuple | None = None  # wordpiece: the id in the full vocabulary (a teacher's row) of every token

    def describe(self) -> dict:
        return {"corpus": "pydoc_data.topics", "text_sha256": self.text_sha256, "vocabulary": self.vocabulary,
                "vocab": self.vocab,
                "train_tokens": int(self.train.size), "heldout_tokens": int(self.heldout.size),
                "heldout": f"the last {HELDOUT_FRACTION:.0%} of every topic"}

    def decode(self, ids) -> str:
        return b"".join(self.pieces[int(i)] for i in ids).decode("utf-8", errors="replace")


def check_vocab(vocab: int) -> None:
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise PitcheckError(f"--adversary lm needs --vocab in [{MIN_VOCAB}, {MAX_VOCAB}] (a byte-level BPE "
                            f"vocabulary of the documentation text), got {vocab}")


def load_corpus(vocab: int, vocabulary: str = "bpe") -> Corpus:
    """The split text tokenised by `vocabulary`: "bpe" (learned here) or "wordpiece:VOCAB.txt" (cached)."""
    if vocabulary == "bpe":
        return _bpe_corpus(vocab)
    return _wordpiece_corpus(vocab, wordpiece_path(vocabulary))


def wordpiece_path(vocabulary: str) -> str:
    kind, _, path = vocabulary.partition(":")
    if kind != "wordpiece" or not path:
        raise PitcheckError(f"lm.vocabulary must be 'bpe' or 'wordpiece:VOCAB.txt', got {vocabulary!r}")
    if not Path(path).is_file():
        raise PitcheckError(f"lm.vocabulary {vocabulary}: no such file")
    return path


@functools.lru_cache(maxsize=2)
def read_wordpiece(path: str) -> tuple[str, ...]:
    """A BERT-style vocab.txt: one token a line, its id the line number."""
    try:
        tokens = tuple(Path(path).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError) as exc:
        raise PitcheckError(f"cannot read the WordPiece vocabulary {path}: {exc}") from None
    if "[UNK]" not in tokens or len(tokens) < MIN_VOCAB:
        raise PitcheckError(f"{path} is not a WordPiece vocabulary (a token a line, with [UNK])")
    return tokens


def _is_punctuation(ch: str) -> bool:
    o = ord(ch)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or \
        unicodedata.category(ch).startswith("P")


def basic_words(text: str) -> list[str]:
    """Uncased BERT pre-tokenisation: lower case, accents stripped, split at white space and around every
    punctuation character; control characters dropped."""
    text = unicodedata.normalize("NFD", text.lower())
    out, word = [], []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Mn" or (cat.startswith("C") and ch not in "\t\n\r"):
            continue
        if ch.isspace() or _is_punctuation(ch):
            if word:
                out.append("".join(word))
                word = []
            if not ch.isspace():
                out.append(ch)
        else:
            word.append(ch)
    if word:
        out.append("".join(word))
    return out


def wordpiece_ids(word: str, index: dict, unk: int, max_chars: int = 100) -> list[int]:
    """Greedy longest-match-first pieces of one word ('##' marks a piece inside a word); [UNK] if none fit."""
    if len(word) > max_chars:
        return [unk]
    ids, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in index:
                ids.append(index[piece])
                break
            end -= 1
        if end == start:
            return [unk]
        start = end
    return ids


@functools.lru_cache(maxsize=2)
def _wordpiece_corpus(vocab: int, path: str) -> Corpus:
    """The text in a pretrained model's WordPiece vocabulary, cut to its `vocab` tokens most frequent in the
    training text ([UNK] stands for the rest): the model's embedding rows `rows` are a teacher for it."""
    check_vocab(vocab)
    tokens = read_wordpiece(path)
    index = {t: i for i, t in enumerate(tokens)}
    unk = index["[UNK]"]
    train_text, held_text = split_text()
    cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        out = []
        for w in basic_words(text):
            if w not in cache:
                cache[w] = wordpiece_ids(w, index, unk)
            out.extend(cache[w])
        return out

    train, held = encode(train_text), encode(held_text)
    counts = Counter(train)
    counts.pop(unk, None)
    # the most frequent (ties: the smaller id), in the full vocabulary's order
    kept = sorted([unk] + [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab - 1]])
    if len(kept) < vocab:
        raise PitcheckError(f"the training text uses only {len(kept)} tokens of {path}; choose --vocab <= {len(kept)}")
    new = {t: i for i, t in enumerate(kept)}
    to_new = np.vectorize(lambda t: new.get(t, new[unk]), otypes=[np.int64])
    sha = hashlib.sha256((train_text + "\0" + held_text).encode("utf-8")).hexdigest()
    pieces = tuple(tokens[t].encode("utf-8") for t in kept)
    return Corpus(vocab, to_new(np.array(train)), to_new(np.array(held)), pieces, sha, f"wordpiece:{path}",
                  tuple(kept))


@functools.lru_cache(maxsize=4)
def _bpe_corpus(vocab: int) -> Corpus:
    """The split text tokenised by a vocab-token BPE vocabulary learned from its training part (cached)."""
    check_vocab(vocab)
    train_text, held_text = split_text()
    train_chunks = chunks(train_text)
    merges = learn_merges(Counter(train_chunks), vocab - 256)
    rank = {p: r for r, p in enumerate(merges)}
    pieces = [bytes([b]) for b in range(256)]
    for a, b in merges:
        pieces.append(pieces[a] + pieces[b])

    @functools.lru_cache(maxsize=None)
    def encode_chunk(chunk: bytes) -> tuple[int, ...]:
        # apply the merges in the order learned: the lowest-ranked pair present first
        s = list(chunk)
        while len(s) > 1:
            best = min(zip(s, s[1:]), key=lambda p: rank.get(p, len(rank)))
            if best not in rank:
                break
            new, merged, k = 256 + rank[best], [], 0
            while k < len(s):
                if k + 1 < len(s) and (s[k], s[k + 1]) == best:
                    merged.append(new)
                    k += 2
                else:
                    merged.append(s[k])
                    k += 1
            s = merged
        return tuple(s)

    def encode(chs: list[bytes]) -> np.ndarray:
        return np.fromiter((t for c in chs for t in encode_chunk(c)), dtype=np.int64)

    sha = hashlib.sha256((train_text + "\0" + held_text).encode("utf-8")).hexdigest()
    return Corpus(vocab, encode(train_chunks), encode(chunks(held_text)), tuple(pieces), sha)
