"""Lints of the chapters' exported code: names a generated module uses but never defines,
and a chapter that imports what only a later chapter exports."""

from __future__ import annotations

import ast
from pathlib import Path

from .paths import ROOT
from .source import imported_modules, package_modules


def undefined_names(name: str, code: str) -> list[str]:
    """Names a generated module uses but never defines or imports: a chapter can run (its
    notebook imports them in a cell that is not exported) while the module it exports
    fails. Needs pyflakes (a dev dependency); without it the check is skipped."""
    try:
        from pyflakes.checker import Checker
        from pyflakes.messages import UndefinedName
    except ImportError:
        return []
    found = Checker(ast.parse(code), filename=name).messages
    return [f"{name}, line {m.lineno}: {m.message % m.message_args}; import it in an export "
            "cell of its chapter" for m in found if isinstance(m, UndefinedName)]


def import_graph() -> dict[str, set[str]]:
    """What each module of minixl needs when it is imported, file by file: the packages it
    lies in (Python runs them first) and its top-level imports (and its import_module
    calls), by dotted name under the package."""
    modules = package_modules()
    graph = {}
    for name, (path, package) in modules.items():
        parts = name.split(".")
        graph[name] = {".".join(parts[:i]) for i in range(1, len(parts))} | imported_modules(
            path.read_text(), name=name, is_package=package, known=modules,
            top_level_only=True)
    return graph


def import_order(parsed: list[dict], owner: dict[str, Path],
                 graph: dict[str, set[str]] | None = None) -> list[str]:
    """A chapter may use only what earlier chapters export: no minixl module its cells import
    may need, itself or through the modules it imports (file by file), a later chapter's
    module, nor its own chapter's module but through the chapter's own package (minixl/NAME/:
    the hand-written files beside the generated module, such as its experiments)."""
    chapter_of = {m: path.stem[:2] for m, path in owner.items()}
    graph = import_graph() if graph is None else graph

    def needs(module: str, seen: tuple = ()) -> tuple[str, tuple[str, ...]] | None:
        """(chapter, the modules from `module` to the generated one) of the latest chapter
        a module needs, or None."""
        if module in chapter_of:
            return chapter_of[module], (module,)
        if module in seen or module not in graph:
            return None
        found = [n for d in sorted(graph[module]) if (n := needs(d, seen + (module,)))]
        if not found:
            return None
        chapter, path = max(found, key=lambda n: (n[0], -len(n[1])))
        return chapter, (module,) + path

    problems = []
    for chapter in parsed:
        number, where = chapter["path"].stem[:2], chapter["path"].relative_to(ROOT)
        own = chapter["module"]
        # what each cell names: minixl.two.experiments, not the package two it runs first
        # (needs() follows the graph there: a chapter's package builds on its module)
        used = set().union(set(), *(imported_modules(c, known=graph, parents=False)
                                    for c in chapter["code"]))
        for module in sorted(used):
            need = needs(module)
            at_home = own is not None and module.startswith(f"{own}.")
            if need and (need[0] > number or (need[0] == number and not at_home)):
                via = ", ".join(f"minixl.{m}" for m in need[1][1:])
                problems.append(f"{where} imports minixl.{module}, which needs chapter "
                                f"{need[0]}'s module" + (f" (through {via})" if via else "")
                                + ": a chapter may use only what earlier chapters export")
    return problems
