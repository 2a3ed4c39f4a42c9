"""Running the chapters in place: fresh outputs, no timing metadata, pairs kept in step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .paths import BOOK, NBS


def run_chapters(names: list[str]) -> None:
    """Execute chapters in place (fresh outputs, no timing metadata), keeping pairs in step."""
    bin_dir = Path(sys.executable).parent
    targets = [NBS / f"{n}.ipynb" for n in names] or sorted(NBS.glob("[0-9][0-9]_*.ipynb"))
    for nb in targets:
        md = BOOK / (nb.stem + ".md")
        subprocess.run([bin_dir / "jupytext", "--sync", str(md)], check=True)
        subprocess.run(
            [bin_dir / "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
             "--ExecutePreprocessor.record_timing=False", "--ExecutePreprocessor.timeout=600",
             str(nb)], check=True, cwd=NBS,
        )
        subprocess.run([bin_dir / "jupytext", "--sync", str(nb)], check=True)
        # JupyterLab refuses a pair whose notebook is newer than its text file.
        os.utime(md)
