"""The library's imports point one way: no module of minixl imports, at its top or inside a
function, a module that imports it back, and each module imports on its own in a fresh
interpreter (so that none relies on another having been imported first)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import loaded_after

PACKAGE = Path(__file__).resolve().parent.parent / "minixl"


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, text: str, is_package: bool, known) -> set[str]:
    """The minixl modules that module `name` (whose source is text) imports anywhere in it (a
    `from X import y` counts X, or X.y where that is a module: importing a sibling through its
    package is not an import of the package's other members)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{a.name}" for a in node.names} & set(known)
            found |= submodules if submodules else {source}
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and getattr(node.func, "id", getattr(node.func, "attr", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target = node.args[0].value
            found.add(package + target if target.startswith(".") else target)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path.read_text(), path.name == "__init__.py", known)
            for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (each a circle of imports)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_of_minixl_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_the_circle_finder_sees_a_circle_through_an_import_inside_a_function():
    """Its positive control: the edges a circle hides in (a function's import, a sibling
    imported through its package, importlib.import_module) are read."""
    known = {"minixl.a": None, "minixl.b": None, "minixl.pkg": None, "minixl.pkg.c": None}
    code = {"minixl.a": "from .b import x\n",
            "minixl.b": "def f():\n    from .pkg import c\n",
            "minixl.pkg.c": "import importlib\nimportlib.import_module('minixl.a')\n"}
    graph = {name: _imports(name, code.get(name, ""), name == "minixl.pkg", known)
             for name in known}
    assert circles(graph) == [["minixl.a", "minixl.b", "minixl.pkg.c"]]
    code["minixl.pkg.c"] = ""  # and no circle where there is none
    graph = {name: _imports(name, code.get(name, ""), name == "minixl.pkg", known)
             for name in known}
    assert circles(graph) == []


def _reach(graph, start):
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_layers_of_the_kinds_point_one_way():
    """evaluation <- model_kind <- each chapter's kind (minixl.NAME.kind) ... kinds (the
    registry, which names them and imports none) <- plugins <- scoring, launch <- cli: none
    of them reaches a layer above it, even through another module (that the registry imports
    no chapter when it is imported is the next test's)."""
    graph = import_graph()
    layers = ["minixl.evaluation", "minixl.model_kind", "minixl.kinds", "minixl.plugins",
              "minixl.scoring", "minixl.launch", "minixl.cli"]
    for i, layer in enumerate(layers):
        above = set(layers[i + 1:]) & _reach(graph, layer)
        assert not above, f"{layer} reaches {sorted(above)}"
    homes = sorted(n for n in graph if n.endswith(".kind"))
    assert len(homes) == 5, homes
    # the chapters' kinds build on model_kind and reach none of the registry's layers; the
    # chapters' modules and the trainer's loop reach not even model_kind
    for low in homes:
        assert "minixl.model_kind" in _reach(graph, low), low
        assert not set(layers[2:]) & _reach(graph, low), low
    for low in ["minixl.char_transformer", "minixl.xlnet", "minixl.segtree", "minixl.training"]:
        assert not set(layers[1:]) & _reach(graph, low), low


CHAPTERS = ["char_transformer", "aux_losses", "relative_attention", "transformer_xl", "xlnet",
            "segtree", "one_bench"]  # the chapters' homes, in the book's order


def test_each_chapters_code_is_in_its_home_and_needs_no_later_chapter():
    """Every file of minixl named after a chapter lies in that chapter's home (minixl/NAME/);
    each file of a home, imported, needs no later chapter's module; the registries (of kinds,
    of runs, of checkers) and the planner need none at all, the trainer and the benchmark
    Chapter 1's only (the learning-rate schedule). Read file by file, as the chapter-order
    lint reads them: the imports that run when a module is imported."""
    from tools.book.lint import import_graph as at_import

    graph = at_import()
    homeless = [n for n in graph if n.rpartition(".")[2] in CHAPTERS and "." in n]
    assert homeless == [], homeless
    # what stays outside the homes: the registry of runs and the table of checkers, with the
    # checks of every kind and the shared verdicts
    assert {n for n in graph if n.startswith(("experiments.", "check."))} == {
        "experiments.__main__", "check.kinds", "check.verdicts"}
    for i, chapter in enumerate(CHAPTERS):
        home = [n for n in graph if n == chapter or n.startswith(chapter + ".")]
        assert {chapter, f"{chapter}.check"} <= set(home), home
        for module in home:
            later = _reach(graph, module) & set(CHAPTERS[i + 1:])
            assert not later, f"minixl.{module} needs {sorted(later)}"
    for module, allowed in [("kinds", set()), ("experiments", set()), ("check", set()),
                            ("planner", set()), ("training", {"char_transformer"}),
                            ("bench", {"char_transformer"})]:
        assert _reach(graph, module) & set(CHAPTERS) == allowed, module


def test_the_registry_loads_a_kind_and_what_it_needs_on_first_use():
    """`import minixl.kinds` imports no chapter; `KINDS["xlnet"]` imports Chapter 5's home
    and the chapters it builds on, never the SegTree model; listing the names loads none."""
    chapters = {f"minixl.{c}" for c in CHAPTERS}
    loaded, _ = loaded_after("from minixl.kinds import KINDS\n"
                           "assert list(KINDS) == ['char', 'shaw', 'xl', 'xlnet', 'segtree']\n"
                           "assert 'segtree' in KINDS and KINDS.loaded() == []")
    assert not loaded & chapters, loaded
    loaded, _ = loaded_after("from minixl.kinds import KINDS\nk = KINDS['xlnet']\n"
                           "assert k.name == 'xlnet' and KINDS.loaded() == ['xlnet']")
    assert {"minixl.xlnet", "minixl.xlnet.kind"} <= loaded, loaded
    assert not loaded & {"minixl.segtree", "minixl.segtree.kind", "minixl.one_bench"}, loaded


def test_a_kind_named_in_the_registry_must_be_the_kind_it_names():
    import dataclasses
    import importlib

    from minixl.kinds import KINDS, Registry

    table = Registry({"char": "minixl.aux_losses.kind:CHAR",
                      "wrong": "minixl.aux_losses.kind:CHAR"})
    assert "char" in table and table.loaded() == []
    assert table["char"] is importlib.import_module("minixl.aux_losses.kind").CHAR
    assert table.loaded() == ["char"]
    with pytest.raises(TypeError, match="minixl.aux_losses.kind:CHAR is not a ModelKind "
                                        "called 'wrong'"):
        table["wrong"]
    with pytest.raises(KeyError):
        table["absent"]
    del table["wrong"]
    assert list(table) == ["char"] and "wrong" not in table
    # a kind put under a name the table only names yet takes its place, once
    table = Registry({"char": "minixl.aux_losses.kind:CHAR", "shaw": "no.such.module:SHAW"})
    mine = dataclasses.replace(KINDS["char"], name="shaw", summary="mine")
    table["shaw"] = mine
    assert list(table) == ["char", "shaw"] and len(table) == 2 and table["shaw"] is mine
    table["new"] = mine
    assert list(table) == ["char", "shaw", "new"]


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(n for n in _modules() if not n.endswith("__main__"))
    code = ("import importlib, subprocess, sys\n"
            "bad = []\n"
            f"for name in {names!r}:\n"
            "    r = subprocess.run([sys.executable, '-c', 'import ' + name],"
            " capture_output=True, text=True)\n"
            "    if r.returncode:\n"
            "        bad.append((name, r.stderr.strip().splitlines()[-1]))\n"
            "print(bad)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=PACKAGE.parent, timeout=900)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
