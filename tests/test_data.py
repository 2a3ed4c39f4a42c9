import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from minixl import data
from minixl.data import CorpusSpec, DownloadError


def test_pydoc_corpus_is_split_90_5_5_and_keeps_every_byte():
    c = data.load_corpus("pydoc")
    raw = data.pydoc_text()
    assert len(c.train) + len(c.valid) + len(c.test) == len(raw)
    assert len(c.valid) == len(c.test) == len(raw) // 20
    assert bytes(torch.cat([c.train, c.valid, c.test]).tolist()) == raw
    assert hashlib.sha256(raw).hexdigest()[:12] in c.description


def test_encode_decode_round_trip_of_non_ascii():
    text = "naïve 주의\n"
    assert data.decode(data.encode(text)) == text
    assert len(data.encode(text)) == len(text.encode("utf-8"))


def test_local_file_corpus_and_errors(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abc\n" * 100)
    c = data.load_corpus(str(f))
    assert len(c.train) == 360 and len(c.valid) == len(c.test) == 20
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        data.load_corpus(str(empty))
    with pytest.raises(ValueError, match="unknown corpus 'enwik9'.*pydoc, enwik8, text8"):
        data.load_corpus("enwik9")


def test_random_windows_targets_are_inputs_shifted_by_one():
    d = torch.arange(100, dtype=torch.uint8)
    x, y = data.random_windows(d, 4, 10, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    with pytest.raises(ValueError, match="needs at least 11"):
        data.random_windows(d[:10], 1, 10)


def test_stream_batches_are_b_parallel_contiguous_streams():
    d = torch.arange(103, dtype=torch.uint8)
    batches = list(data.stream_batches(d, 4, 7))
    xs = torch.cat([x for x, _ in batches], dim=1)  # (4, 25)
    ys = torch.cat([y for _, y in batches], dim=1)
    n = 102 // 4
    for b in range(4):
        assert torch.equal(xs[b], torch.arange(b * n, (b + 1) * n))
        assert torch.equal(ys[b], xs[b] + 1)
    assert [x.shape[1] for x, _ in batches] == [7, 7, 7, 4]


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving files from a folder."""
    root = tmp_path / "www"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def make_zip(root: Path, text: bytes) -> tuple[Path, str]:
    z = root / "mini.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("mini", text)
    return z, hashlib.sha256(z.read_bytes()).hexdigest()


def spec_for(url, z, sha, text, **kw):
    args = dict(name="mini", url=url + "/mini.zip", zip_bytes=z.stat().st_size, zip_sha256=sha,
                member="mini", raw_bytes=len(text), split=(len(text) - 20, 10, 10))
    return CorpusSpec(**{**args, **kw})


def test_fetch_corpus_downloads_verifies_and_unpacks(server, tmp_path):
    root, url = server
    text = b"hello world\n" * 50
    z, sha = make_zip(root, text)
    cache = tmp_path / "cache"
    raw = data.fetch_corpus(spec_for(url, z, sha, text), root=cache)
    assert raw.read_bytes() == text
    assert sorted(p.name for p in cache.iterdir()) == ["mini", "mini.zip"]  # no .part left over
    z.unlink()  # cached now: a second call needs no server file
    assert data.fetch_corpus(spec_for(url, cache / "mini.zip", sha, text), root=cache) == raw


def test_bad_digest_is_refused_and_nothing_is_written(server, tmp_path):
    root, url = server
    text = b"some text\n" * 30
    z, _ = make_zip(root, text)
    cache = tmp_path / "cache"
    with pytest.raises(DownloadError, match="SHA-256"):
        data.fetch_corpus(spec_for(url, z, "0" * 64, text), root=cache)
    assert list(cache.iterdir()) == []


def test_wrong_size_is_refused(server, tmp_path):
    root, url = server
    text = b"x" * 100
    z, sha = make_zip(root, text)
    with pytest.raises(DownloadError, match=r"got \d+ bytes, expected 5;"):
        data.download(url + "/mini.zip", tmp_path / "f.zip", size=5, sha256=sha)
    assert not (tmp_path / "f.zip").exists()


def test_failed_download_keeps_an_existing_file(server, tmp_path):
    _, url = server
    dest = tmp_path / "keep.zip"
    dest.write_bytes(b"old")
    with pytest.raises(DownloadError, match="place the file at"):
        data.download(url + "/missing.zip", dest, size=3, sha256="0" * 64)
    assert dest.read_bytes() == b"old"


def test_offline_error_names_the_url_and_the_manual_step(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}/enwik8.zip"
    with pytest.raises(DownloadError) as err:
        data.download(url, tmp_path / "enwik8.zip", size=10, sha256="0" * 64, timeout=5)
    assert url in str(err.value) and str(tmp_path / "enwik8.zip") in str(err.value)


def test_standard_corpora_use_the_90_5_5_million_split():
    for spec in data.CORPORA.values():
        assert spec.split == (90_000_000, 5_000_000, 5_000_000) and spec.raw_bytes == 10**8
        assert spec.url.startswith("http://mattmahoney.net/dc/") and len(spec.zip_sha256) == 64
