"""Text as bytes: corpora, verified downloads, and the batch sources the trainer reads.

Hand-written (not generated from a chapter); the preface and Chapter 1 show how
to use it. Every corpus is a sequence of byte values 0..255, so the vocabulary
is always 256 and no byte (newlines included) is ever dropped.

Corpora:
- ``pydoc``: the default. The reference text of the Python language that ships
  with every CPython (``pydoc_data.topics``), so it works offline anywhere.
  About 0.47 MB; its exact size and digest depend on the Python version and are
  reported by :func:`load_corpus`.
- ``enwik8`` and ``text8``: downloaded once from their canonical URLs into a
  cache folder, checked by size and SHA-256, written atomically; split into the
  standard 90M / 5M / 5M bytes.
- any path to a local text file: split 90% / 5% / 5%.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import torch

__all__ = [
    "VOCAB_SIZE", "CorpusSpec", "CORPORA", "Corpus", "DownloadError", "cache_dir",
    "pydoc_text", "download", "fetch_corpus", "load_corpus", "encode", "decode",
    "random_windows", "stream_tensors", "stream_batches", "Batch", "RandomWindows",
    "OrderedStreams", "step_seed",
]

VOCAB_SIZE = 256


@dataclass(frozen=True)
class CorpusSpec:
    """Where a zipped corpus lives and what it must look like once fetched."""

    name: str
    url: str
    zip_bytes: int
    zip_sha256: str
    member: str
    raw_bytes: int
    split: tuple[int, int, int]


CORPORA = {
    "enwik8": CorpusSpec(
        "enwik8", "http://mattmahoney.net/dc/enwik8.zip", 36_445_475,
        "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        "enwik8", 100_000_000, (90_000_000, 5_000_000, 5_000_000),
    ),
    "text8": CorpusSpec(
        "text8", "http://mattmahoney.net/dc/text8.zip", 31_344_016,
        "a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232",
        "text8", 100_000_000, (90_000_000, 5_000_000, 5_000_000),
    ),
}
BUILTIN = ("pydoc",)


class DownloadError(RuntimeError):
    """A corpus could not be downloaded or failed its checks."""


@dataclass
class Corpus:
    """A corpus as three uint8 tensors of byte values, plus a line that describes it."""

    name: str
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    description: str
    sha256: str = field(default="", repr=False)  # of all the corpus's bytes: a run's identity

    def __repr__(self) -> str:
        return (f"Corpus({self.name!r}, train={len(self.train):,}, valid={len(self.valid):,}, "
                f"test={len(self.test):,} bytes)")


def cache_dir() -> Path:
    """Where downloads go: $MINIXL_DATA, else ~/.cache/minixl."""
    return Path(os.environ.get("MINIXL_DATA", Path.home() / ".cache" / "minixl"))


def pydoc_text() -> bytes:
    """The default corpus: every topic of Python's own language reference, in name order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_target(dest: Path):
    """An open temporary file beside dest, and its path; a clear error if the folder is not ours."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    except OSError as err:
        raise DownloadError(
            f"cannot write to the corpus cache folder {dest.parent} ({err.strerror or err}); "
            "set MINIXL_DATA to a folder you can write to (default: ~/.cache/minixl)") from err
    return os.fdopen(fd, "wb"), Path(tmp)


def download(url: str, dest: Path, *, size: int, sha256: str, timeout: float = 60.0) -> Path:
    """Download url to dest, check its size and SHA-256, then move it into place atomically."""
    dest = Path(dest)
    out, tmp = _atomic_target(dest)
    try:
        with out, urllib.request.urlopen(url, timeout=timeout) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                out.write(block)
        got_size = tmp.stat().st_size
        if got_size != size:
            raise DownloadError(f"{url}: got {got_size:,} bytes, expected {size:,}; "
                                "the download was cut short or the file changed. Try again.")
        got = _sha256(tmp)
        if got != sha256:
            raise DownloadError(f"{url}: SHA-256 is {got}, expected {sha256}; refusing to use it.")
        os.replace(tmp, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        raise DownloadError(
            f"could not download {url} ({err}). If this machine is offline, fetch that URL "
            f"elsewhere and place the file at {dest} (it must be {size:,} bytes with "
            f"SHA-256 {sha256})."
        ) from err
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch_corpus(spec: CorpusSpec, *, root: Path | None = None) -> Path:
    """Return the path of the unpacked corpus, downloading and unpacking it if needed."""
    root = Path(root) if root is not None else cache_dir()
    raw = root / spec.member
    if raw.exists() and raw.stat().st_size == spec.raw_bytes:
        return raw
    zpath = root / (spec.name + ".zip")
    if not (zpath.exists() and zpath.stat().st_size == spec.zip_bytes
            and _sha256(zpath) == spec.zip_sha256):
        download(spec.url, zpath, size=spec.zip_bytes, sha256=spec.zip_sha256)
    out, tmp = _atomic_target(raw)
    try:
        with out, zipfile.ZipFile(zpath) as z, z.open(spec.member) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        if tmp.stat().st_size != spec.raw_bytes:
            raise DownloadError(f"{zpath}: member {spec.member!r} has {tmp.stat().st_size:,} "
                                f"bytes, expected {spec.raw_bytes:,}")
        os.replace(tmp, raw)
    except KeyError as err:
        raise DownloadError(f"{zpath} has no member {spec.member!r}") from err
    except zipfile.BadZipFile as err:
        zpath.unlink(missing_ok=True)
        raise DownloadError(f"{zpath} is not a valid zip file ({err}); it was removed, "
                            "try again") from err
    finally:
        tmp.unlink(missing_ok=True)
    return raw


def _split(name: str, data: bytes, sizes: tuple[int, int, int] | None, description: str) -> Corpus:
    if not data:
        raise ValueError(f"corpus {name!r} is empty: expected a file with some text in it")
    if sizes is None:
        n_valid = n_test = max(1, len(data) // 20)
        sizes = (len(data) - n_valid - n_test, n_valid, n_test)
    if sum(sizes) != len(data) or min(sizes) < 1:
        raise ValueError(f"corpus {name!r} has {len(data)} bytes, too few to split into "
                         f"train/valid/test {sizes}")
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    a, b = sizes[0], sizes[0] + sizes[1]
    return Corpus(name, t[:a], t[a:b], t[b:], description, hashlib.sha256(data).hexdigest())


def load_corpus(name: str = "pydoc", *, root: Path | None = None) -> Corpus:
    """Load a corpus by name ('pydoc', 'enwik8', 'text8') or by a path to a text file."""
    if name == "pydoc":
        data = pydoc_text()
        digest = hashlib.sha256(data).hexdigest()[:12]
        return _split(name, data, None, f"pydoc: Python's language reference, "
                      f"{len(data):,} bytes, sha256 {digest}...")
    if name in CORPORA:
        spec = CORPORA[name]
        data = fetch_corpus(spec, root=root).read_bytes()
        return _split(name, data, spec.split, f"{name}: {len(data):,} bytes from {spec.url}")
    path = Path(name).expanduser()
    if not path.is_file():
        known = ", ".join(BUILTIN + tuple(CORPORA))
        raise ValueError(f"unknown corpus {name!r}: expected one of {known}, "
                         "or the path of an existing text file")
    data = path.read_bytes()
    return _split(path.name, data, None, f"{path.name}: {len(data):,} bytes from {path}")


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of text as a LongTensor [T] of values 0..255."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(tokens) -> str:
    """Byte values back to text; bytes that are not valid UTF-8 become U+FFFD."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def random_windows(data: torch.Tensor, batch_size: int, seq_len: int, *,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """B windows at random offsets: inputs x [B, T] and next-byte targets y [B, T].

    The offsets are drawn on the CPU (by `generator`, a CPU generator) and the windows are
    gathered where data lives: data on a GPU gives batches on that GPU, and only the B offsets
    cross to it, never the bytes."""
    if len(data) < seq_len + 1:
        raise ValueError(f"data has {len(data)} bytes; a window of seq_len={seq_len} needs "
                         f"at least {seq_len + 1}")
    starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
    if data.device.type != "cpu":
        starts = starts.to(data.device, non_blocking=True)
    idx = starts[:, None] + torch.arange(seq_len + 1, device=data.device)  # (B, T+1)
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def stream_tensors(data: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """data [N] cut into batch_size parallel streams: inputs x and next bytes y, each [B, n].

    n = (N - 1) // B; the last (N - 1) % B bytes are left out.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = (len(data) - 1) // batch_size
    if n < 1:
        raise ValueError(f"data has {len(data)} bytes, too few for {batch_size} streams")
    x_all = data[: n * batch_size].long().view(batch_size, n)       # (B, n)
    y_all = data[1 : n * batch_size + 1].long().view(batch_size, n)  # (B, n)
    return x_all, y_all


def stream_batches(data: torch.Tensor, batch_size: int, seg_len: int
                   ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Ordered batches: data cut into B parallel streams, read in consecutive segments.

    Row b of every batch continues row b of the previous one, as segment
    recurrence (Transformer-XL) needs. Yields x, y [B, seg_len]; the last
    segment may be shorter.
    """
    if seg_len < 1:
        raise ValueError(f"seg_len must be positive, got {seg_len}")
    x_all, y_all = stream_tensors(data, batch_size)
    for start in range(0, x_all.size(1), seg_len):
        yield x_all[:, start:start + seg_len], y_all[:, start:start + seg_len]


class Batch(NamedTuple):
    """One training batch: inputs x [B, T]; targets y [B, T], the next bytes for the book's
    sources (a source of a kind's own may put there what its objective reads: XLNet's
    PretrainStreams puts each row's direction, its objective's targets being x itself); and
    `reset_state`, True when no state may be carried into it from the previous batch."""

    x: torch.Tensor
    y: torch.Tensor
    reset_state: bool


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for step `step` of a run seeded `seed`: the same numbers for the same step,
    whatever ran before it, so a resumed run draws what an uninterrupted one would."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + stream) % (2 ** 63)


class RandomWindows:
    """Batch source for windowed models: batch(step) -> B windows at random offsets.

    The offsets depend only on (seed, step), so a run resumed at step k sees the batches
    an uninterrupted run sees, and every process of a distributed run sees the same batch
    (each takes its own rows). Every batch resets the state: windowed models keep none.
    Batches are on data's device (`minixl train` puts the train split on the GPU once).
    """

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, *, seed: int = 0):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and "
                             f"{seq_len}")
        if len(data) < seq_len + 1:
            raise ValueError(f"{len(data):,} bytes are too few for windows of {seq_len} bytes; "
                             "use more text or shorter windows")
        self.data, self.batch_size, self.seq_len, self.seed = data, batch_size, seq_len, seed

    def __call__(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(step_seed(self.seed, step))
        x, y = random_windows(self.data, self.batch_size, self.seq_len, generator=gen)
        return Batch(x, y, True)


class OrderedStreams:
    """Batch source for models with memory: batch(step) -> segment `step` of B parallel streams.

    data is cut into B streams (see stream_tensors) read in consecutive segments of seq_len;
    row b of every batch continues row b of the one before. A pass over the streams is
    n_segments steps; its first batch resets the state (the memory starts empty again). The
    streams are views of data (no copy, bytes stay bytes); a batch is on data's device.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        stream_tensors(data[:batch_size + 1], batch_size)  # the checks, on a few bytes
        n = (len(data) - 1) // batch_size  # as stream_tensors cuts them, but kept as bytes
        self.x = data[: n * batch_size].reshape(batch_size, n)  # (B, n) views of data, uint8
        self.y = data[1 : n * batch_size + 1].reshape(batch_size, n)
        self.seq_len, self.n_segments = seq_len, n // seq_len
        if self.n_segments < 1:
            raise ValueError(f"{len(data):,} bytes are too few for {batch_size} streams of at "
                             f"least one segment of {seq_len} bytes; use more text, fewer "
                             "streams (batch size) or shorter segments")

    def __call__(self, step: int) -> Batch:
        segment = step % self.n_segments
        cols = slice(segment * self.seq_len, (segment + 1) * self.seq_len)
        return Batch(self.x[:, cols].long(), self.y[:, cols].long(), segment == 0)
