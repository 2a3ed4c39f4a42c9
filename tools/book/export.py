"""The exporter: each chapter's `#| export` cells written into its minixl module, and
minixl/__init__.py, a lazy table of every module's public names.

A chapter is a pair, ``book/NN_name.md`` (MyST markdown) and ``nbs/NN_name.ipynb``. Code cells
that start with the directive ``#| export`` are written, in order, into the module named by
the chapter's ``#| default_exp NAME`` cell, as ``minixl/NAME/__init__.py``: each chapter's
module is a package, its home, where the chapter's hand-written files lie beside it (its
model kind, experiments and checkers). Directives are the leading
``#|`` (or ``# |``, as code formatters write it) lines of a cell; an unknown or misplaced one
is an error, never ignored. Absolute ``from minixl.x import`` lines become relative imports
(``from ..x import``) in the generated module. The exporter reads the markdown side, which is the text reviewers
diff.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .lint import import_order, undefined_names
from .paths import GENERATED, NBS, PKG, ROOT, chapters
from .source import (ExportError, literal_all, module_source, package_modules,
                     public_names, read_chapter)

# Hand-written modules whose public names are also offered at the top level (`minixl.train`).
TOP_LEVEL = ("training", "evaluation", "kinds", "aux_losses.kind", "relative_attention.kind",
             "plugins", "launch", "scoring")


def _relative_imports(code: str, where: str) -> str:
    """'from minixl.x import y' -> 'from ..x import y' (the module is a package's
    __init__.py, whose '.' is its own package); 'import minixl' is refused."""
    out = []
    for line in code.splitlines():
        stripped = line.lstrip()
        if re.match(r"import\s+minixl\b", stripped):
            raise ExportError(f"{where}: exported code must use 'from minixl.x import ...', "
                              f"not {stripped!r}")
        line = re.sub(r"^(\s*)from\s+minixl\.", r"\1from ..", line)
        line = re.sub(r"^(\s*)from\s+minixl\s+import\b", r"\1from .. import", line)
        out.append(line)
    return "\n".join(out)


def render_module(chapter: dict) -> str:
    """The text of the module a parsed chapter exports."""
    md_path, title = chapter["path"], chapter["title"]
    rel_md, rel_nb = md_path.relative_to(ROOT), (NBS / (md_path.stem + ".ipynb")).relative_to(ROOT)
    body = "\n\n\n".join(_cell_marker(rel_md, section) + _relative_imports(code, where)
                          for where, code, section in chapter["exports"])
    header = (
        f'"""{title}\n\nGenerated from {rel_md} (paired with {rel_nb}).\n"""\n\n'
        f"# {GENERATED}: do not edit.\n"
        f"# Edit {rel_md} (or its notebook), then run `make export`.\n\n"
    )
    all_line = "__all__ = [\n" + _wrap(public_names(body)) + ",\n]\n\n"
    # Keep `from __future__` imports first, as Python requires.
    future = [l for l in body.splitlines() if l.startswith("from __future__")]
    rest = "\n".join(l for l in body.splitlines() if not l.startswith("from __future__"))
    return header + ("\n".join(future) + "\n\n" if future else "") + all_line + rest.strip("\n") + "\n"


MARKER = "# %% "


def _cell_marker(rel_md: Path, section: str | None) -> str:
    """The line before each exported cell that names where its prose is (nbdev writes
    `# %% ../nbs/NN_name.ipynb 3`; a section heading is easier to find than a cell number)."""
    return f"{MARKER}{rel_md}" + (f", section {section}" if section else "") + "\n"


def _wrap(names) -> str:
    return textwrap.fill(", ".join(repr(n) for n in names), 88, initial_indent="    ",
                         subsequent_indent="    ", break_on_hyphens=False)


def render_init(generated: dict[str, str]) -> str:
    """minixl/__init__.py: a lazy table of public names, from the modules' own __all__."""
    table: dict[str, str] = {}
    sources = [(m, literal_all(text)) for m, text in sorted(generated.items())]
    sources += [(m, literal_all(module_source(m))) for m in TOP_LEVEL
                if m in package_modules()]
    for module, names in sources:
        for name in names:
            if name in table:
                raise ExportError(f"minixl.{module} and minixl.{table[name]} both export "
                                  f"{name!r}; rename one of them")
            table[name] = module
    modules = sorted({m.partition(".")[0] for m in package_modules()
                      if not m.startswith("_")} | set(generated))
    clash = sorted(set(table) & set(modules))
    if clash:
        raise ExportError(f"public names {clash} clash with module names; rename them")
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(),
                        re.M).group(1)
    rows = "\n".join(f"    {n!r}: {m!r}," for n, m in sorted(table.items()))
    return f'''"""minixl: the library exported by the chapters of the minixl book.

Every public name of every module is reachable from here (``minixl.CharTransformer``,
``minixl.train``), and every module too (``minixl.check``). Names load lazily, on first
use, so importing one module never imports a later chapter's.
"""

# {GENERATED} from the modules' __all__: do not edit.

from importlib import import_module as _import_module

__version__ = "{version}"

_NAMES = {{
{rows}
}}
_MODULES = (
{_wrap(modules)},
)
__all__ = sorted(_NAMES) + list(_MODULES)


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(_import_module(f"{{__name__}}.{{_NAMES[name]}}"), name)
    elif name in _MODULES:
        value = _import_module(f"{{__name__}}.{{name}}")
    else:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
'''


def export(check: bool = False) -> list[str]:
    """Write (or, with check=True, compare) every generated file; return problems."""
    problems, parsed = [], []
    for md in chapters():
        try:
            parsed.append(read_chapter(md))
        except ExportError as err:
            problems.append(str(err))
    if problems:  # without a chapter's module, __init__.py would lose its names and the
        return problems  # module would be reported as stray: write and compare nothing
    owner = {c["module"]: c["path"] for c in parsed if c["module"]}
    texts = {c["module"]: render_module(c) for c in parsed if c["module"]}
    problems += import_order(parsed, owner)
    if problems:  # an import-order problem can be a circular import: write nothing
        return problems
    problems += [p for m, t in texts.items()
                 for p in undefined_names(f"minixl/{m}/__init__.py", t)]
    try:
        files = {f"{m}/__init__.py": t for m, t in texts.items()} | {
            "__init__.py": render_init(texts)}
    except ExportError as err:
        return problems + [str(err)]
    for name, text in files.items():
        path = PKG / name
        if check:
            if not path.exists() or path.read_text() != text:
                module = name.partition("/")[0]
                source = owner[module].relative_to(ROOT) if module in owner else "the modules"
                problems.append(f"minixl/{name} is out of date with {source} (run `make export`)")
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    for path in sorted([*PKG.glob("*.py"), *PKG.glob("*/__init__.py")]):
        name = path.relative_to(PKG).as_posix()
        if name not in files and "# " + GENERATED in path.read_text():
            problems.append(f"minixl/{name} is generated but no chapter exports it any "
                            "more; delete it or restore its chapter")
    return problems


