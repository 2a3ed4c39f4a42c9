"""The reach task of the bench of every mechanism: text in which an answer must be copied from
d bytes back, for d from 16 to thousands, and its scorer by distance band.

Hand-written (not generated). Chapter 4.10's recall records, generalised to many distances in
one stream: each record is '#', `word` random letters, a newline, a line of dots, a newline,
the same letters again and a newline. Letter k of the second copy sits exactly d bytes after
letter k of the first, so a model that reads d bytes back can copy it, and one that cannot
must guess among 26 letters (log2 26, about 4.70 bits). The dots and the framing are
predictable from nearby bytes; only the second copy's letters need reach.

`reach_records` makes the stream and says which bytes are answers and how far back each one's
source is; `score_reach` turns a model's log-probabilities at those bytes into accuracy and
bits per answer by band of distance; `unreachable` names the distances a model cannot reach
by construction, from its kind's `reach` (window, memory, tree), before anything trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["LETTERS", "CHANCE_BITS", "ReachRecords", "reach_records", "distance_bands",
           "score_reach", "unreachable"]

LETTERS = 26
CHANCE_BITS = math.log2(LETTERS)  # a uniform guess among the letters


@dataclass(frozen=True)
class ReachRecords:
    """A stream of records (data [n] uint8), and for each answer byte its position in the
    stream (`answers` [A]) and how many bytes back its source letter is (`distance` [A])."""

    data: torch.Tensor
    answers: torch.Tensor
    distance: torch.Tensor


def reach_records(n_records: int, distances, *, word: int = 6, seed: int = 0) -> ReachRecords:
    """n_records records, each at a distance drawn uniformly from `distances` (bytes between a
    letter and its copy, each at least word + 2), letters and draws seeded by `seed`."""
    distances = [int(d) for d in distances]
    if n_records < 1 or word < 1:
        raise ValueError(f"need n_records >= 1 and word >= 1, got {n_records} and {word}")
    if not distances or min(distances) < word + 2:
        raise ValueError(f"each distance must be at least word + 2 = {word + 2} (the letters "
                         f"and the two newlines between the copies), got {distances}")
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(distances), (n_records,), generator=g)
    letters = torch.randint(ord("a"), ord("z") + 1, (n_records, word), generator=g)
    head, nl = torch.tensor([ord("#")]), torch.tensor([10])
    parts, answers, far, start = [], [], [], 0
    for w, i in zip(letters, pick.tolist()):
        d = distances[i]
        dots = torch.full((d - word - 2,), ord("."))
        record = torch.cat([head, w, nl, dots, nl, w, nl])
        second = start + 1 + word + 1 + len(dots) + 1  # the first letter of the second copy
        answers.append(torch.arange(second, second + word))
        far.append(torch.full((word,), d))
        parts.append(record)
        start += len(record)
    return ReachRecords(torch.cat(parts).to(torch.uint8), torch.cat(answers), torch.cat(far))


def distance_bands(distances) -> list[tuple[int, int]]:
    """Bands [low, high] of distance, one per distance given, sorted, each from its distance
    up to the next one's less one (the last: its own): every distance in exactly one band."""
    ds = sorted({int(d) for d in distances})
    if not ds:
        raise ValueError("no distances given")
    return [(d, nxt - 1) for d, nxt in zip(ds, ds[1:])] + [(ds[-1], ds[-1])]


def score_reach(log_probs: torch.Tensor, targets: torch.Tensor, distance: torch.Tensor,
                bands) -> list[dict]:
    """Accuracy (the most probable byte is the answer) and bits per answer (-log2 of the
    answer's probability), per band of distance: log_probs [A, V] (natural log) at the answer
    bytes, targets [A] the answers, distance [A]. A band no answer falls in gives cases 0 and
    no scores. Chance, for reference: accuracy 1/26, CHANCE_BITS bits."""
    if log_probs.dim() != 2 or not (len(log_probs) == len(targets) == len(distance)):
        raise ValueError(f"expected log_probs [A, V], targets [A] and distance [A] for the same "
                         f"A answers, got {tuple(log_probs.shape)}, {tuple(targets.shape)} and "
                         f"{tuple(distance.shape)}")
    right = log_probs.argmax(-1) == targets
    bits = -log_probs.gather(1, targets.long()[:, None])[:, 0] / math.log(2)
    rows = []
    for low, high in bands:
        inside = (distance >= low) & (distance <= high)
        n = int(inside.sum())
        rows.append({"band": f"{low}-{high}" if high > low else str(low), "low": low,
                     "high": high, "cases": n,
                     "accuracy": right[inside].float().mean().item() if n else None,
                     "bits": bits[inside].mean().item() if n else None})
    return rows


def unreachable(kind, config, distances) -> dict[int, str]:
    """{distance: why} for the distances a model of this kind and config cannot reach by
    construction (its kind's `reach`: how far back from a byte its prediction can read, at
    most); an empty dict when it can reach them all, or when the kind does not say."""
    if kind.reach is None:
        return {}
    most, how = kind.reach(config)
    return {int(d): f"a prediction reads at most {most:,} bytes back ({how})"
            for d in distances if int(d) > most}
