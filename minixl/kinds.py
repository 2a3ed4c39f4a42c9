"""Model kinds: what a model must declare so that minixl can train, resume, evaluate, sample
and benchmark it, and the registry of kinds.

Hand-written glue (not generated). A `ModelKind` holds all that the trainer, the evaluation
protocols, the benchmark and the command line need to know about a model, so that none of
them ever asks which model it holds:

- its config class and builder, and the config field of its length;
- how its batches come: random windows, or ordered streams whose state the trainer carries
  (for every config, or for those a function of the config picks);
- its objective (the trainer's next-byte loss unless it says otherwise) and that
  objective's command-line options;
- its presets (`Preset`: model sizes, training settings, objective options and a line of
  help; a paper-scale preset picks its model);
- its evaluation protocols (the default first) and the config fields `minixl eval` may
  change for the memory protocol;
- the parameters that weight decay leaves alone (position tables and learned offsets), its
  training FLOPs per token for the benchmark, and a line of help for each config field.

This module imports no chapter: the book's own kinds are declared and registered in
`minixl.models`, which the functions here load when they first look a kind up. A model of
your own plugs in the same way, without changing minixl: build a ModelKind in your own
module and either call `register(kind)` (from Python) or name it on the command line as
``--model MODULE:NAME`` (see the README). Every model meets the model protocol,
``logits, state = model.step(tokens, state)``, and keeps its config as ``model.config`` (a
dataclass).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Callable

import torch
import torch.nn as nn

from .data import OrderedStreams, RandomWindows
from .options import Option, flag

__all__ = ["Preset", "Objective", "ModelKind", "KINDS", "DEFAULT_MODEL", "register", "kind_of",
           "paper_presets", "resolve_preset", "model_fields", "with_overrides", "not_for"]


@dataclass(frozen=True)
class Preset:
    """A named setting of a model kind: config fields of the model, TrainConfig fields, the
    objective's options, and a line of help. A paper-scale preset (paper=True) names its
    model: `--preset NAME` alone picks it."""

    model: dict
    train: dict
    objective: dict = field(default_factory=dict)
    help: str = ""
    paper: bool = False


@dataclass(frozen=True)
class Objective:
    """How a kind trains, if not on the trainer's next-byte loss: build(model_config,
    **options) returns the objective (a function, or an nn.Module with weights of its own),
    `options` are its command-line options, and tag(options) is the line a checkpoint keeps
    so that a resumed run is refused another objective."""

    build: Callable
    options: tuple[Option, ...] = ()
    tag: Callable[[dict], str] | None = None


# Help for config fields that most models share; a kind's field_help adds or overrides.
COMMON_FIELD_HELP = {
    "n_layer": "layers", "d_model": "the model width", "n_head": "attention heads",
    "d_inner": "the feed-forward width", "dropout": "dropout", "dropatt": "dropout on "
    "attention weights", "layer_norm_eps": "the layer norms' epsilon",
}


@dataclass(frozen=True)
class ModelKind:
    """Everything minixl needs to know about one model (see the module docstring)."""

    name: str
    summary: str
    config: type  # a dataclass; every field with a default is a command-line flag
    build: Callable[[object], nn.Module]
    length: str  # the config field that holds the training length
    presets: dict[str, Preset]
    # False: random windows, no state; True: ordered streams, state carried; or a function of
    # the model's config that says which (XLNet reads streams only when it has a memory)
    streams: bool | Callable[[object], bool] = False
    # evaluation protocols, the default first: names of the book's (minixl.evaluation.PROTOCOLS)
    # or Protocol objects of the kind's own
    protocols: tuple = ("all-positions", "sliding")
    objective: Objective | None = None  # None: the trainer's next-byte loss at every position
    no_decay: tuple[str, ...] = ()  # parameter names (the last part) weight decay leaves alone
    flops: Callable[[nn.Module], float] | None = None  # training FLOPs per token (None: 6N)
    eval_overrides: tuple[str, ...] = ()  # config fields `minixl eval` may change for memory
    field_help: dict[str, str] = field(default_factory=dict)
    source: str | None = None  # "MODULE:NAME" for a kind loaded from outside minixl
    causal: bool = True  # no position reads a later byte (checked by minixl.check.kind)
    # a batch source of its own, (data, batch_size, length, *, seed, config) -> (step -> (x,
    # y, fresh)), in place of the one `streams` picks; config is the model's config, and a
    # source that returns None for a config leaves the choice to `streams`
    batch_source: Callable | None = None
    # the module that declared it ("__main__" in a notebook), also for a kind made with
    # dataclasses.replace: set when it is made, never copied
    origin: str | None = field(default=None, compare=False, init=False)

    def __post_init__(self):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in ("dataclasses", __name__):
            frame = frame.f_back  # past __init__ and dataclasses.replace
        object.__setattr__(self, "origin", frame.f_globals.get("__name__") if frame else None)
        names = {f.name for f in fields(self.config)}
        wrong = [self.length] if self.length not in names else []
        wrong += [k for p in self.presets.values() for k in p.model if k not in names]
        wrong += [k for k in self.eval_overrides if k not in names]
        if wrong:
            raise ValueError(f"model kind {self.name!r}: {', '.join(sorted(set(wrong)))} "
                             f"{'is not a field' if len(wrong) == 1 else 'are not fields'} of "
                             f"{self.config.__name__}")
        options = {o.name for o in self.objective.options} if self.objective else set()
        extra = [k for p in self.presets.values() for k in p.objective if k not in options]
        if extra:
            raise ValueError(f"model kind {self.name!r}: a preset sets objective options "
                             f"{', '.join(sorted(set(extra)))}, which its objective does not take")
        if not isinstance(self.streams, bool) and not callable(self.streams):
            raise ValueError(f"model kind {self.name!r}: streams must be True, False or a "
                             f"function of the model's config, got {self.streams!r}")
        if not self.protocols or not self.presets:
            raise ValueError(f"model kind {self.name!r} needs at least one evaluation protocol "
                             "and one preset")
        from .evaluation import PROTOCOLS

        unknown = [p for p in self.protocols if isinstance(p, str) and p not in PROTOCOLS]
        if unknown:
            raise ValueError(f"model kind {self.name!r}: unknown evaluation protocol "
                             f"{', '.join(map(repr, unknown))}: name one of "
                             f"{', '.join(PROTOCOLS)}, or give a minixl.evaluation.Protocol")
        if len(set(self.protocol_names)) < len(self.protocols):
            raise ValueError(f"model kind {self.name!r} names a protocol twice")

    # ---- evaluation
    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(p if isinstance(p, str) else p.name for p in self.protocols)

    def protocol_objects(self) -> tuple:
        """Its protocols as minixl.evaluation.Protocol objects, the default first."""
        from .evaluation import PROTOCOLS

        return tuple(PROTOCOLS[p] if isinstance(p, str) else p for p in self.protocols)

    def protocol(self, name: str | None = None):
        """The Protocol called `name` (default: its first), or a clear error."""
        found = {p.name: p for p in self.protocol_objects()}
        if name is None:
            return next(iter(found.values()))
        if name not in found:
            raise ValueError(f"--protocol {name} does not apply to a --model {self.name} "
                             f"checkpoint; use {' or '.join(found)}")
        return found[name]

    # ---- presets
    def preset(self, name: str) -> tuple[object, dict]:
        """(model config, TrainConfig settings) of a named preset."""
        if name not in self.presets:
            raise ValueError(f"unknown preset {name!r} for --model {self.name}: expected one of "
                             f"{', '.join(self.presets)}")
        p = self.presets[name]
        return self.config(**p.model), dict(p.train)

    @property
    def scale_preset(self) -> str:
        """The preset the benchmark reads by default: the paper-scale one, else base, else
        the last."""
        papers = [n for n, p in self.presets.items() if p.paper]
        return papers[0] if papers else "base" if "base" in self.presets else list(self.presets)[-1]

    # ---- the objective
    def objective_options(self, preset: str, given: dict | None = None) -> dict:
        """The objective's options: its defaults, then the preset's, then those given (a flag
        this kind's objective does not take is an error that names the kinds taking it)."""
        given = {k: v for k, v in (given or {}).items() if v is not None}
        own = self.objective.options if self.objective else ()
        foreign = [k for k in given if k not in {o.name for o in own}]
        if foreign:
            takers = [k.name for k in _known().values() if k.objective and
                      set(foreign) <= {o.name for o in k.objective.options}]
            raise ValueError(not_for(foreign, takers, self.name))
        preset_options = self.presets[preset].objective if preset in self.presets else {}
        return {o.name: o.default for o in own} | preset_options | given

    def build_objective(self, model_cfg, options: dict):
        """The objective to train with (None: the trainer's next-byte loss)."""
        return self.objective.build(model_cfg, **options) if self.objective else None

    def objective_tag(self, options: dict) -> str | None:
        """What a checkpoint records of the objective (None: nothing to record)."""
        return self.objective.tag(options) if self.objective and self.objective.tag else None

    # ---- data and cost
    def reads_streams(self, model_cfg) -> bool:
        """Whether a model of this config trains on ordered streams, its state carried."""
        return bool(self.streams(model_cfg) if callable(self.streams) else self.streams)

    def batches(self, data: torch.Tensor, batch_size: int, model_cfg, *, seed: int):
        """The batch source of this kind: step -> (x, y, fresh)."""
        length = getattr(model_cfg, self.length)
        if self.batch_source is not None:
            own = self.batch_source(data, batch_size, length, seed=seed, config=model_cfg)
            if own is not None:
                return own
        source = _streams if self.reads_streams(model_cfg) else RandomWindows
        return source(data, batch_size, length, seed=seed)

    def flops_per_token(self, model: nn.Module) -> float:
        """Training FLOPs per token: the kind's own count, else 6 per weight (2 forward,
        4 backward), the usual estimate that leaves attention out."""
        if self.flops is not None:
            return self.flops(model)
        return 6.0 * sum(p.numel() for p in model.parameters())

    def help_for(self, field_name: str) -> str:
        return self.field_help.get(field_name, COMMON_FIELD_HELP.get(field_name, ""))


def _streams(data, batch_size: int, length: int, *, seed: int):
    """Ordered streams (their order is the text's: the seed has nothing to choose)."""
    return OrderedStreams(data, batch_size, length)


def not_for(names: list[str], takers, kind: str) -> str:
    """The message for settings that a kind does not have: which kinds take them."""
    return (f"{', '.join(map(flag, names))} appl{'ies' if len(names) == 1 else 'y'} to --model "
            f"{' or '.join(sorted(set(takers))) or '(none)'}, not --model {kind}")


if "KINDS" not in globals():  # importlib.reload(minixl.kinds) keeps the registry
    KINDS: dict[str, ModelKind] = {}
DEFAULT_MODEL = "char"  # what `minixl train` trains without --model


def _known() -> dict[str, ModelKind]:
    """KINDS, with the book's own kinds registered (importing minixl.models does that)."""
    importlib.import_module(".models", __package__)
    return KINDS


def _is_kind(obj) -> bool:
    """A ModelKind, also one made before importlib.reload(minixl.kinds) made the class anew."""
    return any(c.__module__ == __name__ and c.__qualname__ == "ModelKind"
               for c in type(obj).__mro__)


def register(*kinds: ModelKind, replace: bool = False) -> ModelKind:
    """Add model kinds to KINDS, so that `minixl.setup_run`, `model_from_checkpoint` and the
    command line (--model NAME) know them; returns the last.

    Declaring a kind again in the module that declared it (re-running a notebook cell,
    reloading a module) replaces it. A name taken by a kind from elsewhere is an error,
    unless replace=True. All or nothing: if one kind is refused, none is added."""
    for kind in kinds:
        if not _is_kind(kind):
            raise TypeError(f"register() takes minixl.kinds.ModelKind objects, got "
                            f"{type(kind).__name__}")
    names = [k.name for k in kinds]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"register() was given two model kinds called {twice[0]!r}")
    known = _known()  # (inside minixl.models' own import: the kinds it registered so far)
    for kind in kinds:
        old = known.get(kind.name)
        if old is not None and old is not kind and not replace and old.origin != kind.origin:
            raise ValueError(f"a model kind called {kind.name!r} is registered already "
                             f"(declared in {old.source or old.origin}); give yours another "
                             "name, or register(kind, replace=True) to take its place")
    for kind in kinds:
        KINDS[kind.name] = kind
    return kinds[-1]


def _import_kind(spec: str) -> ModelKind:
    """The ModelKind that --model MODULE:NAME names, imported (from the current folder too, as
    `python -m` would) and registered."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr.isidentifier():
        raise ValueError(f"--model {spec}: expected MODULE:NAME, e.g. mymodels:BIGRAM (a "
                         "ModelKind called BIGRAM in mymodels.py)")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name or not all(
            part.isidentifier() for part in module_name.split(".")):
        raise ValueError(f"--model {spec}: {module_name} is not a module name: name the module, "
                         "not its file (--model mymodels:NAME for mymodels.py, run from its "
                         "folder or with the folder on PYTHONPATH)")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    importlib.invalidate_caches()  # a file written a moment ago (by a notebook, say) is found
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ValueError(f"--model {spec}: {_not_found(module_name, err)}") from (
            None if err.name and (module_name + ".").startswith(err.name + ".") else err)
    except SyntaxError as err:  # (IndentationError too): the line the parser stopped at
        if err.filename and not err.filename.startswith("<"):
            raise ValueError(f"--model {spec}: {_short(err.filename)} is not valid Python, line "
                             f"{err.lineno}: {err.msg}") from err
        raise ValueError(f"--model {spec}: importing {module_name} raised SyntaxError: "
                         f"{err.msg}{_where(err)}") from err
    except SystemExit as err:
        raise ValueError(f"--model {spec}: importing {module_name} ended the program (exit "
                         f"{err.code}){_where(err)}: keep a script's own code under `if __name__ "
                         "== '__main__':`, so that importing it only declares") from None
    except Exception as err:  # noqa: BLE001 - any error of the module's own code, named
        said = str(err).strip().splitlines()
        raise ValueError(f"--model {spec}: importing {module_name} raised "
                         f"{type(err).__name__}{': ' + said[0] if said else ''}"
                         f"{_where(err)}") from err
    kind = getattr(module, attr, None)
    if not _is_kind(kind):
        raise ValueError(f"--model {spec}: {module_name}.{attr} is "
                         f"{'missing' if kind is None else 'a ' + type(kind).__name__}, not a "
                         "minixl.kinds.ModelKind")
    old = KINDS.get(kind.name)
    if old is not None and old.source == spec:
        return old
    found = replace(kind, source=spec)
    object.__setattr__(found, "origin", kind.origin)  # its module's, not this one's
    return register(found)


def _not_found(module_name: str, err: ModuleNotFoundError) -> str:
    """Why a module of one's own did not import: it is not there, it imports a package that is
    not installed, or it imports a file of one's own that is not on the path."""
    missing = err.name
    if missing is None:
        return f"importing {module_name} raised ModuleNotFoundError: {err}{_where(err)}"
    if (module_name + ".").startswith(missing + "."):
        return (f"cannot find a module {module_name} (no {module_name.replace('.', '/')}.py here "
                "or on PYTHONPATH); run from the folder that holds it or put it on PYTHONPATH")
    if missing.split(".")[0] == module_name.split(".")[0]:
        return (f"{module_name} imports {missing}, which cannot be found beside it "
                f"(misspelt, or not written yet?){_where(err)}")
    return (f"{module_name} imports {missing}, which is not installed in this Python "
            f"({sys.executable}): install the package that provides it there, or, if it is a "
            f"file of yours, put it beside {module_name.split('.')[0]}.py{_where(err)}")


def _short(path: str | None) -> str:
    """A file's path, relative to the current folder where it lies under it."""
    if not path:
        return "?"
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _where(err: BaseException) -> str:
    """' (at FILE, line N)': the innermost line of the error's traceback in the user's own
    code, not in Python's import machinery, the standard library, an installed package or
    minixl itself (whose checks a kind's declaration meets: the line that declared it is
    named)."""
    import site
    import sysconfig
    import traceback

    places = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    places += [*site.getsitepackages(), site.getusersitepackages(), os.path.dirname(__file__)]
    skip = tuple({os.path.realpath(p) + os.sep for p in places})
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<")]
    own = [f for f in frames if not os.path.realpath(f.filename).startswith(skip)]
    if not own:
        return ""
    return f" (at {_short(own[-1].filename)}, line {own[-1].lineno})"


def kind_of(name: str) -> ModelKind:
    """The ModelKind called `name` (a registered name, or MODULE:NAME of one of your own), or a
    clear error."""
    if name in _known():
        return KINDS[name]
    if ":" in name:
        return _import_kind(name)
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(KINDS)}, or "
                     "MODULE:NAME for a ModelKind of your own")


def paper_presets() -> dict[str, str]:
    """Paper-scale preset -> the model it belongs to, over every registered kind."""
    return {name: kind.name for kind in _known().values()
            for name, p in kind.presets.items() if p.paper}


def resolve_preset(model: str | None, preset: str | None) -> tuple[ModelKind, str]:
    """(kind, preset) from --model and --preset: a paper-scale preset picks its model;
    otherwise the model defaults to DEFAULT_MODEL and the preset to tiny."""
    preset = "tiny" if preset is None else preset
    papers = paper_presets()
    if preset in papers:
        own = papers[preset]
        if model is not None and kind_of(model).name != own:
            raise ValueError(f"--preset {preset} is a --model {own} preset, not a --model "
                             f"{model} one: drop --model or use --model {own}")
        model = own if model is None else model
    kind = kind_of(DEFAULT_MODEL if model is None else model)
    if preset not in kind.presets or papers.get(preset, kind.name) != kind.name:
        names = [n for n in kind.presets if papers.get(n, kind.name) == kind.name]
        raise ValueError(f"unknown preset {preset!r} for --model {kind.name}: expected one of "
                         f"{', '.join(names)}")
    return kind, preset


def model_fields(kinds=None) -> dict[str, tuple[type, list[str]]]:
    """Every config setting of the kinds (all registered ones by default) that a flag may
    set: name -> (type, the kinds that have it)."""
    found: dict[str, tuple[type, list[str]]] = {}
    for kind in _known().values() if kinds is None else kinds:
        for f in fields(kind.config):
            if f.name != "vocab_size" and f.default is not MISSING:
                found.setdefault(f.name, (type(f.default), []))[1].append(kind.name)
    return found


def with_overrides(cfg, **overrides):
    """A copy of a dataclass config with the non-None overrides applied (validated again)."""
    names = {f.name for f in fields(cfg)}
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None and k in names})
