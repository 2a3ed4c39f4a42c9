"""Training: one short loop over the model protocol, for every model in minixl.

Hand-written shared machinery (not generated). Read `loop.py` first: `TrainConfig` and
`train`, the loop that Chapter 1 writes out by hand, with `train_step`, the one optimiser
step that both the loop and the benchmark run. The rest can be skipped on a first reading:

- `setup.py`: the set-up of a run (`setup_run`, `build_model`), what `minixl train` calls;
- `optim.py`: AdamW and its weight-decay groups;
- `run_folder.py`: checkpoints, metrics.csv and loss.png, resuming;
- `signals.py`: stopping after a whole step on Ctrl-C or SIGTERM;
- `distributed.py`: several processes under torchrun;
- `state.py`: a model's state of any shape, split, moved and saved.
"""

from .loop import Net, TrainConfig, TrainResult, next_byte_objective, train, train_step
from .optim import decay_groups, decays, make_optimizer
from .run_folder import SaveFailed, TrainingDiverged
from .setup import build_model, run_settings, setup_run
from .signals import TrainingInterrupted

__all__ = ["TrainConfig", "TrainResult", "TrainingInterrupted", "TrainingDiverged", "SaveFailed",
           "train", "train_step", "next_byte_objective", "Net", "decays", "decay_groups",
           "make_optimizer", "setup_run", "run_settings", "build_model"]
