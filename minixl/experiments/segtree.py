"""Chapter 6's experiment: the cost of one attention layer (SegTree, dense written out, dense
fused) against its length.

Hand-written (not generated): an entry of the registry of runs (`minixl.experiments`);
Chapter 6 plots the stored CSV and names the command that made it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

__all__ = ["segtree_cost", "slopes"]


def segtree_cost(max_n: int = 4096, min_n: int = 256, repeats: int = 3,
                 device: str = "auto") -> list[dict]:
    """Every method of `minixl.segtree.attention_layer_cost` at n = min_n, 2 min_n, ...,
    max_n, each point in a fresh process, so that the peak memory it reports is the
    layer's own."""
    from ..device import resolve_device
    from ..segtree import LAYER_METHODS

    if min_n < 2 or max_n < min_n:
        raise ValueError(f"need 2 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    sizes = [min_n << i for i in range(int(math.log2(max_n // min_n)) + 1)]
    device = str(resolve_device(device))
    rows = []
    for n in sizes:
        for method in LAYER_METHODS:
            code = ("import json; from minixl.segtree import attention_layer_cost; print(json.dumps("
                    f"attention_layer_cost({method!r}, {n}, repeats={repeats}, "
                    f"device={device!r})))")
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"{method} at n={n} failed: {last}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return rows


def slopes(rows: list[dict]) -> str:
    """Per method, its times by n and the fitted slope of log time against log n."""
    from ..segtree import loglog_slope

    lines = [f"one causal attention layer (width 64, 4 heads; segtree k = 1), forward + "
             f"backward on {rows[0]['device']}:"]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        cells = "  ".join(f"n={r['n']}: {1e3 * r['seconds']:.1f} ms, {r['peak_mb']:.0f} MB"
                          for r in mine)
        slope = (f"  (slope {loglog_slope([r['n'] for r in mine], [r['seconds'] for r in mine]):.2f})"
                 if len(mine) > 1 else "")
        lines.append(f"  {method}: {cells}{slope}")
    return "\n".join(lines)
