"""The experiments behind the chapters' stored CSVs: each runs on a tiny setting here."""

import csv

from minixl.experiments import write_csv


def test_write_csv_is_atomic_and_refuses_nothing_to_write(tmp_path):
    path = write_csv([{"a": 1, "b": 2}, {"a": 3, "b": 4}], tmp_path / "x.csv")
    assert list(csv.DictReader(open(path))) == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    assert not list(tmp_path.glob("*.part"))
    try:
        write_csv([], tmp_path / "y.csv")
    except ValueError as err:
        assert "no rows" in str(err)
    else:
        raise AssertionError("an empty experiment must not write a CSV")
    assert not (tmp_path / "y.csv").exists()


def test_depth_sweep_writes_one_row_per_run_and_refuses_bad_options(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "depth.csv"
    cmd = [sys.executable, "-m", "minixl.experiments", "depth", "--depths", "1,2",
           "--seeds", "0", "--steps", "2", "--d-model", "8", "--seq-len", "8",
           "--batch-size", "2", "--eval-bytes", "64", "--csv", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["depth", "norm", "losses", "seed", "steps", "d_model", "seq_len",
                             "train_bpc", "valid_bpc", "seconds"]
    assert [(r["depth"], r["norm"], r["losses"]) for r in rows] == [
        (d, n, l) for d in ("1", "2") for n in ("pre", "post")
        for l in ("positions", "positions+layers")]
    assert all(0 < float(r["valid_bpc"]) < 12 for r in rows)
    bad = subprocess.run(cmd[:-2] + ["--norms", "mid", "--csv", str(tmp_path / "bad.csv")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--norms takes 'pre', 'post' or 'pre,post'" in bad.stderr
    assert not (tmp_path / "bad.csv").exists()


def test_eval_flops_count_what_each_protocol_redoes():
    from minixl.experiments import eval_flops_per_byte

    sizes = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=10)
    # A segment as long as the window predicts A bytes with the work of one window.
    assert eval_flops_per_byte("sliding", 64, **sizes, tgt_len=64) == 64 * eval_flops_per_byte(
        "states", 64, **sizes, tgt_len=64)
    # The hidden-state memory re-projects A - T states into keys and values, and A distances.
    C, HD, A, T = 16, 16, 96, 32
    extra = 2 * ((A - T) * 3 * C * HD + A * C * HD) / T
    assert abs(eval_flops_per_byte("states", A, **sizes, tgt_len=T)
               - eval_flops_per_byte("kv", A, **sizes, tgt_len=T) - extra) < 1e-6
    ratio = [eval_flops_per_byte("sliding", a, **sizes) / eval_flops_per_byte("kv", a, **sizes)
             for a in (256, 512, 1024)]
    assert ratio[0] < ratio[1] < ratio[2]
    for bad in [("window", 64), ("kv", 16)]:
        try:
            eval_flops_per_byte(*bad, **sizes)
        except ValueError as err:
            assert "protocol" in str(err) or "tgt_len" in str(err)
        else:
            raise AssertionError(f"{bad} must be refused")


def test_xl_eval_speed_and_xl_order_write_their_csvs(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "speed.csv"
    cmd = [sys.executable, "-m", "minixl.experiments", "xl_eval_speed", "--lengths", "8,16",
           "--tgt-len", "4", "--n-layer", "1", "--d-model", "8", "--n-head", "2", "--d-head",
           "4", "--d-inner", "8", "--passes", "1", "--streams", "2", "--csv", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["A", "tgt_len", "streams", "sliding_us", "states_us", "kv_us",
                             "measured_states", "measured_kv", "predicted_states",
                             "predicted_kv"]
    assert [r["A"] for r in rows] == ["8", "16"]
    assert all(float(r["predicted_kv"]) > float(r["predicted_states"]) > 1 for r in rows)
    bad = subprocess.run(cmd[:-2] + ["--lengths", "2", "--csv", str(tmp_path / "bad.csv")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "every length >= tgt_len" in bad.stderr
    assert not (tmp_path / "bad.csv").exists()

    path = tmp_path / "order.csv"
    done = subprocess.run([sys.executable, "-m", "minixl.experiments", "xl_order", "--seeds",
                           "0", "--steps", "64", "--eval-bytes", "256", "--csv", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["arm", "seed", "steps", "bpc_at_64", "bpc_at_32", "last_train_bpc"]
    assert [r["arm"] for r in rows] == ["ordered, stale memory", "ordered, no memory",
                                        "random, fresh memory", "random, no memory"]
    assert all(0 < float(r["bpc_at_64"]) < 9 for r in rows)


def test_positions_writes_one_row_per_run_and_refuses_bad_options(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "positions.csv"
    cmd = [sys.executable, "-m", "minixl.experiments", "positions", "--depths", "1",
           "--seeds", "0,1", "--steps", "2", "--csv", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["n_layer", "seed", "pos", "steps", "valid_bpc", "seconds"]
    assert [(r["seed"], r["pos"]) for r in rows] == [
        (s, p) for s in ("0", "1") for p in ("per_layer", "sinusoid")]
    assert all(0 < float(r["valid_bpc"]) < 12 for r in rows)
    bad = subprocess.run(cmd[:-2] + ["--depths", "0", "--csv", str(tmp_path / "bad.csv")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--depths needs at least one integer" in bad.stderr
    assert not (tmp_path / "bad.csv").exists()
