"""Command-line options declared once: the flags that several commands share, and the options
that model kinds and the registry of runs declare for themselves.

Hand-written glue (not generated). An `Option` is a name, a type, a default and a line of
help; `add_options` turns options into argparse flags (``max_n`` becomes ``--max-n``), and
`parent` makes an argparse parent parser of them, so that a flag shared by several commands
(``--device``) is defined in one place.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Option", "flag", "add_options", "parent", "DEVICE", "CHECKPOINT", "CORPUS", "SEED"]


def flag(name: str) -> str:
    """The command-line flag of a setting: max_n -> --max-n."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """One option: `name` as a Python keyword (the flag is --name-with-dashes), its type (bool
    makes an on/off switch), its default, a line of help, and the values it may take."""

    name: str
    type: Callable = str
    default: Any = None
    help: str = ""
    choices: tuple | None = None
    required: bool = False

    @property
    def flag(self) -> str:
        return flag(self.name)

    def add_to(self, parser, *, default: Any = None, keep_default: bool = True) -> None:
        """Add this option to an argparse parser (or group); keep_default=False leaves the
        default None, so that a caller can tell a flag that was given from one that was not."""
        value = self.default if keep_default else default
        shown = f" (default {self.default})" if keep_default and self.default not in (
            None, False, "") else ""
        if self.type is bool:
            parser.add_argument(self.flag, action=argparse.BooleanOptionalAction,
                                default=value, help=self.help + shown)
        else:
            parser.add_argument(self.flag, type=self.type, default=value, choices=self.choices,
                                required=self.required, help=self.help + shown)


def add_options(parser, options, *, keep_defaults: bool = True) -> None:
    """Add every option to parser (see Option.add_to)."""
    for option in options:
        option.add_to(parser, keep_default=keep_defaults)


def parent(*options: Option) -> argparse.ArgumentParser:
    """An argparse parent parser holding these options (argparse's parents=[...])."""
    p = argparse.ArgumentParser(add_help=False)
    add_options(p, options)
    return p


# The flags several commands share, each defined here once.
DEVICE = Option("device", str, "auto", "where to run: auto (CUDA when present), cpu, cuda or "
                "cuda:N")
CHECKPOINT = Option("checkpoint", str, None, "a checkpoint.pt written by `minixl train`, or "
                    "the run folder that holds it", required=True)
CORPUS = Option("corpus", str, None, "pydoc (the default), enwik8, text8, or a path to a "
                "text file")
SEED = Option("seed", int, 0, "the seed")
