"""Reading the library's and the chapters' sources: a chapter's cells and directives, the
minixl modules a piece of code imports, a module's public names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .paths import PKG, ROOT

DIRECTIVES = {"default_exp": 1, "export": 0}  # name -> number of arguments
DIRECTIVE = re.compile(r"^#\s*\|\s*(.*)$")


def hand_written() -> dict[str, list[Path]]:
    """The package's hand-written modules and subpackages: name -> its source files (a
    subpackage's __init__.py first). Generated modules are plain files too; callers that
    must tell them apart read the GENERATED header."""
    found = {p.stem: [p] for p in PKG.glob("*.py") if not p.stem.startswith("_")}
    for init in sorted(PKG.glob("*/__init__.py")):
        found[init.parent.name] = [init] + sorted(p for p in init.parent.glob("*.py")
                                                  if p != init)
    return found


def module_source(name: str) -> str:
    """The text that defines minixl.<name>'s public names: the module, or a package's
    __init__.py."""
    path = PKG / f"{name}.py"
    return (path if path.exists() else PKG / name / "__init__.py").read_text()


class ExportError(Exception):
    """A chapter's export cells cannot be turned into a module."""


def directives(source: str, where: str) -> tuple[list[list[str]], str]:
    """Split a cell's leading directive lines from its code; reject unknown or misplaced ones."""
    lines = source.splitlines()
    found = []
    while lines and DIRECTIVE.match(lines[0]):
        words = DIRECTIVE.match(lines.pop(0)).group(1).split()
        if not words or words[0] not in DIRECTIVES:
            name = words[0] if words else ""
            raise ExportError(f"{where}: unknown directive '#| {name}'; known: "
                              + ", ".join(f"'#| {d}'" for d in DIRECTIVES))
        if len(words) - 1 != DIRECTIVES[words[0]]:
            raise ExportError(f"{where}: '#| {words[0]}' takes {DIRECTIVES[words[0]]} "
                              f"argument(s), got {' '.join(words[1:]) or 'none'}")
        found.append(words)
    for n, line in enumerate(lines, start=len(found) + 1):
        if DIRECTIVE.match(line):
            raise ExportError(f"{where}, line {n}: directive {line.strip()!r} after code; "
                              "directives must be the first lines of a cell")
    return found, "\n".join(lines).strip("\n")


def public_names(code: str) -> list[str]:
    names = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def imported_modules(code: str, *, top_level_only: bool = False,
                      in_package: bool = False) -> set[str]:
    """The minixl submodules a piece of code imports (absolute or relative imports).

    top_level_only: only the imports that run when the module is imported, not those
    inside functions (which is how `check` loads later chapters lazily). in_package: the
    code is a file of a subpackage (minixl/NAME/x.py), whose `..` is minixl and whose `.`
    is its own package (not counted).
    """
    tree = ast.parse(code)
    found = set()
    top = 2 if in_package else 1  # the relative level that names minixl itself
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            absolute = node.level == 0 and (node.module or "").split(".")[0] == "minixl"
            if absolute or node.level == top:
                parts = (node.module or "").split(".")[1 if absolute else 0:]
                found |= {parts[0]} if parts and parts[0] else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("minixl.")}
    return found


def literal_all(code: str) -> list[str]:
    """The names in a module's literal __all__ (empty if it has none)."""
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                 for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def read_chapter(md_path: Path) -> dict:
    """Parse a chapter once: its module name, title, export cells and all code cells."""
    import jupytext

    nb = jupytext.read(md_path)
    module, title, exports, code, heads = None, md_path.stem, [], [], {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            fenced = False
            for line in cell.source.splitlines():
                fenced ^= line.lstrip().startswith(("```", "~~~"))
                level = len(line) - len(line.lstrip("#"))
                if not fenced and level and line[level:level + 1] == " ":  # # Title, ## 4.1
                    heads = {k: v for k, v in heads.items() if k < level}
                    heads[level] = line[level:].strip()
            if title == md_path.stem and 1 in heads:
                title = heads[1]
        if cell.cell_type != "code":
            continue
        # where the cell's prose is: its section and subsection (the title before any)
        section = " / ".join(v for k, v in sorted(heads.items()) if k > 1) or heads.get(1)
        where = f"{md_path.relative_to(ROOT)}, code cell {len(code)}"
        found, body = directives(cell.source, where)
        code.append(body)
        for words in found:
            if words[0] == "default_exp":
                module = words[1]
            else:
                exports.append((where, body, section))
    if exports and module is None:
        raise ExportError(f"{md_path.relative_to(ROOT)}: has '#| export' cells but no "
                          "'#| default_exp NAME' cell")
    return {"path": md_path, "module": module if exports else None, "title": title,
            "exports": exports, "code": code}


