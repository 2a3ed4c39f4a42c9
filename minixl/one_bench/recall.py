"""A recall task that can be learned: multi-query associative recall (MQAR) in bytes, with
every query at a distance the task sets.

Hand-written (not generated). Arora et al.'s multi-query associative recall ("Zoology:
Measuring and Improving Recall in Efficient Language Models", 2023) writes key-value pairs and
then asks for many of them, so that every query is a case to learn from; a small attention
model learns it, and mechanisms differ by how far back they can find a key. Here the stream
is a run of items of `key + 2` bytes each: a key of `key` lowercase letters, then '=' and a
value (an uppercase letter) when the item writes a pair, or '?' and the value written with
that key when it asks for one. Each write is asked for once, `d` bytes later, d drawn from
the distances given (each a whole number of items), so the answer byte sits exactly d bytes
after its source; a key is not written again while it may still be asked for, so every query
has one answer. Only the answers need reach: the keys and the markers are random or fixed,
and a model that cannot read d bytes back guesses among 26 values (log2 26 bits).

`recall_records` makes the stream and says where the answers are and how far back each one's
source is, in the same `ReachRecords` as the reach task of `minixl.reach`, so
`minixl.reach.score_reach` scores it by band of distance and `minixl.reach.unreachable`
names the distances a model cannot reach before it trains. `RecallWindows` is its batch
source, the loss on the answers only (as Zoology trains).
"""

from __future__ import annotations

import torch

from ..data import Batch, step_seed
from ..reach import ReachRecords

__all__ = ["VALUES", "recall_records", "answer_mask", "RecallWindows"]

VALUES = 26  # the values are the uppercase letters: a uniform guess is right 1 time in 26
WRITE, ASK = ord("="), ord("?")


def recall_records(n_items: int, distances, *, key: int = 2, seed: int = 0) -> ReachRecords:
    """A stream of n_items items of key + 2 bytes (data [n_items * (key + 2)] uint8), the
    position of each query's answer byte (`answers` [A], increasing) and how many bytes back
    its source is (`distance` [A]). Each write is asked for once, at a distance drawn from
    `distances` (bytes; each a positive multiple of key + 2); an item no query claims is a
    write. Seeded by `seed`."""
    size = key + 2
    distances = sorted({int(d) for d in distances})
    if n_items < 2 or key < 1:
        raise ValueError(f"need n_items >= 2 and key >= 1, got {n_items} and {key}")
    if not distances or distances[0] < size or any(d % size for d in distances):
        raise ValueError(f"each distance must be a positive multiple of the item size, key + 2 "
                         f"= {size} bytes (an answer sits a whole number of items after its "
                         f"source), got {distances}")
    span = distances[-1] // size  # items a write may wait for its query
    if 26 ** key < 2 * span + 2:
        raise ValueError(f"keys of {key} letters give {26 ** key} keys, too few for pairs "
                         f"asked for up to {span} items later: use a longer key")
    g = torch.Generator().manual_seed(seed)
    asks: dict[int, int] = {}  # item -> the item it asks for
    keys, values = torch.zeros(n_items, key, dtype=torch.long), torch.zeros(n_items, dtype=torch.long)
    marker = torch.full((n_items, 1), WRITE)
    busy: dict[int, int] = {}  # key code -> the last item that may still ask for it
    answers, far = [], []
    for i in range(n_items):
        if i in asks:  # a query: the key and value of the write it asks for
            source = asks.pop(i)
            keys[i], values[i], marker[i] = keys[source], values[source], ASK
            answers.append(i * size + size - 1)
            far.append((i - source) * size)
            continue
        while True:  # a key that no pending query may still ask for
            code = int(torch.randint(26 ** key, (1,), generator=g))
            if busy.get(code, -1) < i:
                break
        keys[i] = torch.tensor([(code // 26 ** k) % 26 for k in range(key)])
        values[i] = int(torch.randint(VALUES, (1,), generator=g))
        d = distances[int(torch.randint(len(distances), (1,), generator=g))] // size
        busy[code] = i + span  # not written again before any query of it could come
        if i + d < n_items and i + d not in asks:
            asks[i + d] = i
    data = torch.cat([keys + ord("a"), marker, (values + ord("A"))[:, None]], dim=1)
    return ReachRecords(data.reshape(-1).to(torch.uint8), torch.tensor(answers, dtype=torch.long),
                        torch.tensor(far, dtype=torch.long))


def answer_mask(records: ReachRecords) -> torch.Tensor:
    """[n] bool, True at the answer bytes: the only positions whose loss the task counts."""
    mask = torch.zeros(len(records.data), dtype=torch.bool)
    mask[records.answers] = True
    return mask


class RecallWindows:
    """Batch source: batch(step) -> B random windows of `length` bytes of the stream, the
    targets -100 (ignored by cross-entropy) except at the answer bytes, so the next-byte loss
    counts the answers only. Seeded by (seed, step), as `minixl.data.RandomWindows`."""

    def __init__(self, records: ReachRecords, batch_size: int, length: int, *, seed: int = 0):
        if len(records.data) < length + 1:
            raise ValueError(f"{len(records.data):,} bytes are too few for windows of {length}")
        self.data, self.batch_size, self.length, self.seed = records.data, batch_size, length, seed
        self.targets = torch.full((len(records.data),), -100, dtype=torch.long)
        self.targets[records.answers] = records.data[records.answers].long()

    def __call__(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(step_seed(self.seed, step))
        starts = torch.randint(len(self.data) - self.length, (self.batch_size,), generator=gen)
        rows = starts[:, None] + torch.arange(self.length)  # (B, T)
        return Batch(self.data[rows].long(), self.targets[rows + 1], True)

