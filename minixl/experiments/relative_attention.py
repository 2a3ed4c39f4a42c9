"""Chapter 3's experiment: the bucket and gathered forms of Shaw et al.'s relative attention,
timed against each other, and the form minixl picks.

Hand-written (not generated): an entry of the registry of runs (`minixl.experiments`).
"""

from __future__ import annotations

from . import int_list

__all__ = ["shaw_cost"]


def shaw_cost(lengths: str | None = None, clips: str = "4,16", repeats: int = 5,
              device: str = "auto") -> list[dict]:
    """Both forms, forward + backward, at every length and clipping distance (the fastest of
    `repeats` runs each), with the fastest form and the one `shaw_form` picks there."""
    import torch

    from ..device import resolve_device
    from ..relative_attention import SHAW_FORMS, shaw_attention_cost, shaw_form

    dev = str(resolve_device(device))
    if lengths is None:
        lengths = "64,128,256,512,1024" if dev.startswith("cuda") else "16,32,64,128,256"
    rows = []
    for T in int_list(lengths, "lengths"):
        for k in int_list(clips, "clips", 0):
            times = {m: shaw_attention_cost(m, T, max_relative=k, repeats=repeats, device=dev)
                     for m in SHAW_FORMS}
            fastest = min(times, key=lambda m: times[m]["seconds"])
            rows.append({"T": T, "max_relative": k, "device": times[fastest]["device"],
                         "torch": torch.__version__,
                         **{f"{m}_ms": 1e3 * r["seconds"] for m, r in times.items()},
                         "fastest": fastest, "chosen": shaw_form(T, T, k)})
    return rows
