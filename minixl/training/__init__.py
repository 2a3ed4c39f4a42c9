"""Training: one short loop over the model protocol, for every model in minixl.

Hand-written shared machinery (not generated). Read `loop.py` first: `TrainConfig` and
`train`, the loop that Chapter 1 writes out by hand, with `train_step`, the one optimiser
step that both the loop and the benchmark run. Setting a run up from a model kind and a
preset is `minixl.launch` (above the kinds; this package sits below the chapters). The rest
can be skipped on a first reading:

- `optim.py`: AdamW and its weight-decay groups;
- `run_folder.py`: the run folder: its lock, checkpoints, resuming, and the files it writes;
- `metrics.py`: the loss meter, what a metrics.csv row holds, reading one back, loss.png;
- `signals.py`: stopping after a whole step on Ctrl-C or SIGTERM;
- `distributed.py`: several processes under torchrun;
- `state.py`: a model's state of any shape, split, moved and saved.
"""

from .loop import (ModelWithLoss, TrainConfig, TrainResult, compile_run, next_byte_objective, train,
                   train_step)
from .optim import decay_groups, decays, make_optimizer
from .metrics import TrainingDiverged
from .run_folder import SaveFailed
from .signals import TrainingInterrupted

__all__ = ["TrainConfig", "TrainResult", "TrainingInterrupted", "TrainingDiverged", "SaveFailed",
           "train", "train_step", "next_byte_objective", "ModelWithLoss", "compile_run", "decays",
           "decay_groups",
           "make_optimizer"]
