"""Reading the library's and the chapters' sources: a chapter's cells and directives, the
minixl modules a piece of code imports, a module's public names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .paths import PKG, ROOT

DIRECTIVES = {"default_exp": 1, "export": 0}  # name -> number of arguments
DIRECTIVE = re.compile(r"^#\s*\|\s*(.*)$")


def module_source(name: str) -> str:
    """The text that defines minixl.<name>'s public names (name dotted under the package:
    "xlnet.kind"): the module, or a package's __init__.py."""
    path = PKG.joinpath(*name.split(".")).with_suffix(".py")
    return (path if path.exists() else PKG.joinpath(*name.split("."), "__init__.py")).read_text()


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


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of minixl by its dotted name under the package ("segtree",
    "xlnet.kind"; a subpackage by its own name, "check"): its file, and whether it is
    a package (its file an __init__.py). minixl's own __init__.py is left out: it is the lazy
    table of every public name, and imports nothing until a name is used."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        if parts:
            found[".".join(parts)] = (path, package)
    return found


def imported_modules(code: str, *, name: str = "", is_package: bool = False,
                     known=None, top_level_only: bool = False, parents: bool = True) -> set[str]:
    """The minixl modules a piece of code imports, by dotted name under the package.

    name, is_package: the module the code is (what its relative imports start from; "" for
    a chapter's cell, which imports minixl absolutely). known: the package's modules, so that
    `from .pkg import mod` counts pkg.mod and `from .mod import x` counts mod (default: every
    module of minixl). parents: a submodule counts its packages too (importing
    minixl.xlnet.check runs minixl/xlnet/__init__.py first). top_level_only: only the
    statements that run when the module is imported (a top-level `if` or `try` included),
    not those inside functions. Calls of importlib.import_module are read wherever they
    are: a string names its module; an f-string names every module under its literal prefix
    (f"minixl.{name}": all of them), since any of them may be loaded.
    """
    known = set(package_modules()) if known is None else set(known)
    package = name if is_package else name.rpartition(".")[0]

    def absolute(level: int, module: str | None, base_package: str | None = None) -> str:
        """The dotted name (under minixl) of a relative or absolute module reference, or
        "" for minixl itself; None where it is not in minixl. base_package: the package a
        relative name starts from (default: the code's own)."""
        if level == 0:
            top, _, rest = (module or "").partition(".")
            return rest if top == "minixl" else None
        start = package if base_package is None else absolute(0, base_package)
        if start is None:
            return None
        base = ["minixl"] + (start.split(".") if start else [])
        if level > len(base):
            return None
        parts = base[:len(base) - level + 1] + ([module] if module else [])
        return ".".join(parts[1:])

    def runs_on_import(tree) -> list:
        """The nodes that run when the module is imported: all but function bodies."""
        out, todo = [], list(tree.body)
        while todo:
            node = todo.pop()
            out.append(node)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(node))
        return out

    def import_module_target(call: ast.Call) -> set[str]:
        """What an import_module(name, package) call may load: a string, its module; an
        f-string, every module under its literal prefix; anything else (a name from a
        table), nothing: a lazy table by name is not an import."""
        arg = call.args[0]
        given = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "package"), None)
        base = given.value if isinstance(given, ast.Constant) else None  # __package__: own
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            level = len(arg.value) - len(arg.value.lstrip("."))
            target = absolute(level, arg.value[level:] or None, base)
            return {target} if target else set()
        if not (isinstance(arg, ast.JoinedStr) and arg.values
                and isinstance(arg.values[0], ast.Constant)):
            return set()
        prefix = arg.values[0].value
        level = len(prefix) - len(prefix.lstrip("."))
        stem = prefix[level:]
        if level == 0 and not stem.startswith("minixl."):
            return set()
        head = absolute(level, stem.rstrip(".") or None, base) if level else stem[7:].rstrip(".")
        if head is None:
            return set()
        if not head:
            return set(known)
        if prefix.endswith("."):  # whole names under the package `head`
            return {m for m in known if m.startswith(head + ".")}
        return {m for m in known if m.startswith(head)}  # a name's first letters

    tree = ast.parse(code)
    found = set()
    nodes = runs_on_import(tree) if top_level_only else list(ast.walk(tree))
    if top_level_only:  # import_module calls anywhere still count
        nodes += [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            source = absolute(node.level, node.module)
            if source is None:
                continue
            subs = {f"{source}.{a.name}".lstrip(".") for a in node.names} & known
            found |= subs
            if len(subs) < len(node.names) and source:  # names of the module itself too
                found.add(source)
        elif isinstance(node, ast.Import):
            found |= {m for a in node.names if (m := absolute(0, a.name))}
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "id", getattr(node.func, "attr", "")) == "import_module"):
            found |= import_module_target(node)
    with_parents = set(found)
    for module in found if parents else ():
        parts = module.split(".")
        with_parents |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in with_parents if m in known and m != name}


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


