"""Model kinds of your own, loaded by name: ``--model MODULE:NAME``.

Hand-written glue (not generated); the top layer of the kinds (see `minixl.model_kind`).
`load_kind` imports a module of yours (from the current folder too, as ``python -m`` would),
takes the ModelKind it names and registers it; whatever goes wrong on the way is one line
that names the file and line of your code. `kind_named` is what the command line and
`minixl.setup_run` call: a registered name, or MODULE:NAME.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig
import traceback
from dataclasses import replace

from .kinds import KINDS, ORIGINS, ModelKind, kind_of, register

__all__ = ["load_kind", "kind_named"]


def kind_named(name: str) -> ModelKind:
    """The ModelKind called `name`: a registered name, or MODULE:NAME of one of your own
    (imported and registered), or a clear error."""
    return load_kind(name) if ":" in name and name not in KINDS else kind_of(name)


def load_kind(spec: str) -> ModelKind:
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
    if not isinstance(kind, ModelKind):
        raise ValueError(f"--model {spec}: {module_name}.{attr} is "
                         f"{'missing' if kind is None else 'a ' + type(kind).__name__}, not a "
                         "minixl.kinds.ModelKind")
    old = KINDS.get(kind.name)
    if old is not None and old.source == spec:
        return old
    # registered already (by a notebook, or by the module that declared it, which `module`
    # only re-exports): the same kind, now with its source, replaces itself
    origin = ORIGINS.get(kind.name) if old is kind else module.__name__
    return register(replace(kind, source=spec), origin=origin)


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
    places = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    places += [*site.getsitepackages(), site.getusersitepackages(), os.path.dirname(__file__)]  # minixl's own files
    skip = tuple({os.path.realpath(p) + os.sep for p in places})
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<")]
    own = [f for f in frames if not os.path.realpath(f.filename).startswith(skip)]
    if not own:
        return ""
    return f" (at {_short(own[-1].filename)}, line {own[-1].lineno})"
