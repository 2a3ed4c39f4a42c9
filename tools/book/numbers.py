"""Numbers in the prose: every number a chapter quotes is a stored output of a cell above it,
or marked as a paper's, a setting, arithmetic on outputs, or another chapter's."""

from __future__ import annotations

import re
from pathlib import Path

from .paths import BOOK, NBS, ROOT, chapters

#
# A number that a chapter's prose quotes (a decimal such as 3.735 or -0.04, a grouped
# integer such as 8,570, either with a unit glued on: 1.61x, 92.12%, 0.89M) must be what a
# stored output of a code cell above it says, printed with at least the prose's digits, to
# the digits the prose writes ("about 3,100" reads 3,067: an integer's trailing zeros after
# "about" are rounding). A signed number needs the same sign. Numbers that no cell prints
# are marked in the same markdown cell, after their paragraph or list, on lines of their
# own, with an HTML comment, which neither JupyterLab nor the website shows:
#     <!-- paper: 1.06 0.99 -->   numbers quoted from a paper (not checked)
#     <!-- given: 0.1 2,100 -->   settings and other numbers the text states, not measures
#     <!-- derived: 0.053 = 3.711 - 3.658 -->   arithmetic (+ - * / and brackets) on stored
#                                 outputs: the result is checked, and each operand must be
#                                 a stored output of the chapter
#     <!-- from chapter 1: 4.75 -->   numbers another chapter prints: found in its outputs
# Each entry of a marker covers one quotation of its number in the cell, and an entry the
# cell does not quote is an error. A short number (fewer than ENOUGH significant digits:
# 0.84, 12.5%, 3,100: an integer's trailing zeros are not significant) could match an
# unrelated output by chance, so it must be printed near: by a code cell above it in its own
# section (since the last "## " heading) or in a section its markdown cell names ("section
# 4.6"). A longer one may come from any cell above it. Section references (section 4.6, Chapters 2 and 3),
# headings, code, math and links are not quoted numbers. Every chapter is under the check.

_UNIT = r"(?:[x\u00d7%]|[MKG](?![A-Za-z]))?"
_QUOTED = re.compile(r"(?:(?<![\w.,])[-\u2212+](?=\d)|(?<![\w.,]))"
                     r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)"
                     + r"(?=" + _UNIT + r"(?:[^\w]|$))(?![.,]\d)")
_ANY_NUMBER = re.compile(r"(?<![0-9A-Za-wyz_.,])[-\u2212+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
                         r"(?:[eE][-+]?\d+)?(?![\d,]*\d)")
_MARKER = re.compile(r"<!--\s*(paper|given|derived|from\s+chapter\s+\d+)\s*:(.*?)-->",
                     re.S | re.I)
ENOUGH = 4  # significant digits that a match anywhere above does not owe to chance
_HEADING = re.compile(r"^## +(?:(\d+(?:\.\d+)*)\b)?", re.M)
_NAMED_SECTIONS = re.compile(r"\b[Ss]ections?\s+(\d+\.\d+(?:(?:,\s*|\s+and\s+|\s+or\s+)"
                             r"\d+\.\d+)*)")
_ABOUT = re.compile(r"\b(?:about|roughly|around|nearly|almost|some)\s+$")
_FENCED = re.compile(r"```.*?```", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_NOT_QUOTED = [
    re.compile(r"<!--.*?-->", re.S),
    _FENCED,
    re.compile(r"\$\$.*?\$\$", re.S),
    re.compile(r"(?<!\\)\$[^$\n]*\$"),
    _INLINE_CODE,
    re.compile(r"\]\([^)\s]*\)"),
    re.compile(r"https?://\S+|arXiv:\s*\d+\.\d+"),
    re.compile(r"^\s*#+ .*$", re.M),
    # a reference and the references listed after it in the same form (4.6 and 4.7; 2 to 3)
    re.compile(r"\b(?:[Ss]ections?|[Cc]hapters?|[Ee]q(?:uation)?s?\.?|[Tt]ables?|[Ff]igures?|"
               r"[Aa]ppendi(?:x|ces))\s+(?:(?:[A-Z]?\d+(?:\.\d{1,2})+)(?:(?:,\s*|\s+and\s+|\s+to\s+|"
               r"\s*[-\u2013]\s*)[A-Z]?\d+(?:\.\d{1,2})+(?![\d]))*|[A-Z]?\d+(?:(?:,\s*|\s+and\s+|\s+to\s+|"
               r"\s*[-\u2013]\s*)[A-Z]?\d+(?![.\d]))*)"),
]


def _blank(text: str, pattern: re.Pattern) -> str:
    """text with every match of pattern replaced by spaces (offsets stay the same)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append("".join(out["text"]))
        data = out.get("data", {})
        for kind in ("text/plain", "text/markdown"):
            if kind in data and "image/png" not in data:
                parts.append("".join(data[kind]))
    return "\n".join(parts)


def _value(token: str) -> float:
    return float(token.replace(",", "").replace("\u2212", "-"))


def _places(token: str) -> int:
    mantissa = re.split(r"[eE]", token)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _printed(cells: list[dict]) -> list[list[tuple[float, int, str]]]:
    """Per code cell, its stored outputs' numbers: (value, decimal places, as printed)."""
    return [[(_value(m.group()), _places(m.group()), m.group())
             for m in _ANY_NUMBER.finditer(_output_text(c))]
            for c in cells if c["cell_type"] == "code"]


def _close(y: float, v: float, places: int) -> bool:
    """Does y read as v when written with `places` decimals?"""
    return abs(y - v) <= 0.5 * 10 ** -places + 1e-12


def _matches(token: str, printed, about: bool = False, scale: int = 0) -> bool:
    """Is token what one of the printed numbers says, to token's digits? The number must be
    printed with at least token's decimals; a signed token needs the same sign; with `about`,
    an integer's trailing zeros are rounding ("about 3,100" reads 3,067). `scale`: the
    token counts in units of 10**scale (0.89M against a printed 891,648: scale 6)."""
    v, places = _value(token), _places(token)
    signed = token[0] in "-\u2212+"
    if about and not places:
        digits = token.replace(",", "").lstrip("-\u2212+")
        places = -(len(digits) - len(digits.rstrip("0") or "0"))
    if not signed:
        v = abs(v)
    return any(p + scale >= max(places, 0)
               and _close(y / 10 ** scale if signed else abs(y) / 10 ** scale, v, places)
               for y, p, _ in printed)


def _significant(token: str) -> int:
    """Significant digits of a quoted number: 0.840 has 3, 8,570 has 3 (an integer's
    trailing zeros are not significant), 8,576 has 4, 12.5% has 3."""
    digits = re.sub(r"[^\d.]", "", token.split("e")[0].split("E")[0])
    whole, dot, frac = digits.partition(".")
    if not dot:
        return len(whole.strip("0"))
    return len((whole + frac).lstrip("0")) if whole.strip("0") else len(frac.lstrip("0"))


def _arithmetic(expr: str) -> float:
    """The value of + - * / and brackets on numbers, and nothing else."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only numbers, + - * / and brackets")

    return value(ast.parse(expr.replace(",", "").replace("\u2212", "-"), mode="eval").body)


def _derived(listed: str, printed) -> tuple[list[str], list[str]]:
    """Parse '<result> = <arithmetic on numbers>; ...': the results, and the problems."""
    results, problems = [], []
    for item in filter(None, (i.strip() for i in listed.split(";"))):
        result, _, expr = item.partition("=")
        result, expr = result.strip(), expr.strip()
        if not _QUOTED.fullmatch(result):
            problems.append(f"derived: {item!r} is not '<number> = <arithmetic on numbers>'")
            continue
        results.append(result)
        try:
            got = _arithmetic(expr)
        except (SyntaxError, ValueError, ArithmeticError, TypeError) as err:
            problems.append(f"derived: {item!r} is not '<number> = <arithmetic on numbers>' "
                            f"({err})")
            continue
        places = _places(result)
        if not _close(got, _value(result), places):
            problems.append(f"derived: {expr} is {got:.{places + 2}f}, not {result}")
        for operand in _ANY_NUMBER.findall(expr):
            if not _matches(operand.lstrip("+"), printed):
                problems.append(f"derived: {operand} (in {item}) is not in the stored outputs")
    return results, problems


def _sentence(text: str, start: int, end: int, width: int = 90) -> str:
    """The sentence (or table row) around text[start:end], at most `width` characters
    either side of it."""
    a = max([text.rfind(sep, 0, start) + len(sep) for sep in (". ", "\n\n", "|")
             if text.rfind(sep, 0, start) >= 0] + [start - width, 0])
    b = min((i for i in (text.find(". ", end), text.find("\n\n", end), text.find("|", end))
             if i >= 0), default=len(text))
    b = min(b + 1, end + width)
    return " ".join(text[a:b].split())


def quoted_number_problems(md_path: Path, nb_path: Path) -> list[str]:
    """Every quoted number of a chapter's prose against the stored outputs above it."""
    import json

    return _problems(md_path.read_text(), json.loads(nb_path.read_text())["cells"],
                     md_path.relative_to(ROOT))


def _problems(md_text: str, cells: list[dict], where, *, cumulative: bool = True) -> list[str]:
    """The quoted numbers of the markdown cells against the outputs of the code cells above
    each (cumulative=False: of the last code cell above only); md_text is the text the
    cells come from (for line numbers)."""
    import json
    from collections import Counter

    per_cell = _printed(cells)
    everything = [n for numbers in per_cell for n in numbers]
    other_chapters: dict[int, list] = {}  # chapter number -> its printed numbers, read once
    problems, above, code_cell, pos = [], [], 0, 0
    section, by_section, here = None, {}, []  # the code cells near the prose
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            # the numbers printed by the code cells so far (or by the last one)
            above = above + per_cell[code_cell] if cumulative else per_cell[code_cell]
            here = here + [code_cell]
            by_section.setdefault(section, []).append(code_cell)
            code_cell += 1
            continue
        if cell["cell_type"] != "markdown":
            continue
        headings = list(_HEADING.finditer(_blank(source, _FENCED)))
        named = {n for m in _NAMED_SECTIONS.finditer(source)
                 for n in re.findall(r"\d+\.\d+", m.group(1))}
        named_cells = {c for name in named for c in by_section.get(name, [])}
        # prose before a heading in this cell is near its own section's cells; after it, a
        # new section has printed nothing yet
        near_above = [n for c in sorted(set(here) | named_cells) for n in per_cell[c]]
        near_below = [n for c in sorted(named_cells) for n in per_cell[c]]
        at = md_text.find(source, pos)
        pos = at + len(source) if at >= 0 else pos
        first_line = md_text.count("\n", 0, at) + 1 if at >= 0 else 0
        markers = list(_MARKER.finditer(_blank(_blank(source, _FENCED), _INLINE_CODE)))
        # (a marker shown as an example, in code, is not one)
        for m in markers:  # on lines of their own, and not between the items of a list
            before = source[source.rfind("\n", 0, m.start()) + 1:m.start()]
            after = source[m.end():].split("\n", 1)[0]
            following = next((ln for ln in source[m.end():].split("\n")[1:] if ln.strip()), "")
            if before or after.strip() or re.match(r"\s*(?:[-*+]|\d+[.)])\s", following):
                line = first_line + source.count("\n", 0, m.start())
                problems.append(f"{where}:{line}: a marker must start a line, end it, and not "
                                "sit between the items of a list (it would break the "
                                "paragraph or the list): put it on lines of its own after "
                                "the paragraph or list")
        exempt = Counter()
        for m in markers:
            kind, listed = m.group(1).lower(), m.group(2)
            if kind == "derived":
                results, wrong = _derived(listed, everything)
                exempt.update(results)
                problems += [f"{where}:{first_line}: {w}" for w in wrong]
            elif kind.startswith("from"):
                number = int(kind.split()[-1])
                if number not in other_chapters:
                    other = sorted(NBS.glob(f"{number:02d}_*.ipynb"))
                    other_chapters[number] = [
                        n for ns in (_printed(json.loads(other[0].read_text())["cells"])
                                     if other else []) for n in ns]
                theirs = other_chapters[number]
                for token in _QUOTED.findall(listed):
                    exempt[token] += 1
                    if not _matches(token, theirs):
                        problems.append(f"{where}:{first_line}: {token} is not in the stored "
                                        f"outputs of chapter {number}")
            else:
                exempt.update(_QUOTED.findall(listed))
        prose = source
        for pattern in _NOT_QUOTED:
            prose = _blank(prose, pattern)
        for m in _QUOTED.finditer(prose):
            token = m.group()
            if exempt[token] > 0:
                exempt[token] -= 1
                continue
            about = bool(_ABOUT.search(prose[max(0, m.start() - 12):m.start()]))
            scale = {"K": 3, "M": 6, "G": 9}.get(prose[m.end():m.end() + 1], 0)
            short = cumulative and _significant(token) < ENOUGH
            near = near_below if headings and headings[0].start() < m.start() else near_above
            if _matches(token, near if short else above, about=about, scale=scale):
                continue
            line = first_line + source.count("\n", 0, m.start())
            if short and _matches(token, above, about=about, scale=scale):
                far = next(c for c in range(code_cell) if _matches(
                    token, per_cell[c], about=about, scale=scale))
                problems.append(
                    f"{where}:{line}: {token} is printed only far above it (code cell {far}, "
                    f"not in its section or a section it names), and a number of fewer than "
                    f"{ENOUGH} digits may match there by chance, in: \""
                    f"{_sentence(source, m.start(), m.end())}\" (quote it with more digits, "
                    f"name the section that prints it, or print it again near)")
                continue
            v = _value(token)
            closest = sorted(((abs(y - v), printed, c) for c, numbers in
                              enumerate(per_cell[:code_cell]) for y, _, printed in numbers))[:3]
            hint = ", ".join(f"{p} (code cell {c})" for _, p, c in closest) or "no outputs above"
            problems.append(
                f"{where}:{line}: {token} is not in the stored outputs above it (closest: "
                f"{hint}) in: \"{_sentence(source, m.start(), m.end())}\" (mark a paper's "
                f"number <!-- paper: {token} -->, a setting or other number no cell computes "
                f"<!-- given: {token} -->, after the paragraph)")
        for token, left in exempt.items():
            if left > 0:
                problems.append(f"{where}:{first_line}: a marker lists {token}, which this "
                                "markdown cell does not quote (as often)")
        if headings:  # the section the next cells belong to
            section, here = headings[-1].group(1), []
    return problems


CSV_NAMED = re.compile(r"\bbook/([A-Za-z0-9_]+\.csv)\b")


def _sections(text: str) -> list[str]:
    """text cut before each heading (a line starting with #, outside fenced code)."""
    sections, current, fenced = [], [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line) and current:
            sections.append("".join(current))
            current = []
        current.append(line)
    return sections + ["".join(current)] if current else sections


def readme_problems(readme: Path = ROOT / "README.md", book: Path = BOOK) -> list[str]:
    """The README under the same check: its sections (split at headings) are the prose, and
    each section's stored outputs are the CSVs under book/ that it names (the runs it quotes;
    a name with no file is where a run would write), as if a cell above it had printed them."""
    import csv

    text = readme.read_text()
    cells = []
    for section in _sections(text):
        prose = _blank(section, _FENCED)  # a CSV named in fenced code is not quoted
        named = sorted(n for n in set(CSV_NAMED.findall(prose)) if (book / n).exists())
        rows = [row for n in named for row in csv.reader((book / n).open(newline=""))]
        printed = "\n".join("   ".join(row) for row in rows)  # fields apart, as printed
        cells += [{"cell_type": "code", "source": "", "outputs": [{"text": printed}]},
                  {"cell_type": "markdown", "source": section}]
    return _problems(text, cells, readme.name, cumulative=False)


def pages_problems(root: Path = ROOT) -> list[str]:
    """readme_problems for the README and every page under docs/ (the README's reference
    material, moved there)."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [f"{p.parent.name}/{m}" if p.parent != root else m
            for p in pages for m in readme_problems(p, root / "book")]


def check_numbers(names=None) -> list[str]:
    problems = []
    for stem in names or [p.stem for p in chapters()]:
        md, nb = BOOK / f"{stem}.md", NBS / f"{stem}.ipynb"
        if md.exists() and nb.exists():
            problems += quoted_number_problems(md, nb)
    return problems
