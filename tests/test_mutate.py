"""The mutation run (`make mutate`, tools/mutate.py) stays runnable: each mutant still applies
to today's code exactly once, and names tests that exist. (The run itself is not part of
`make test`: it takes about ten minutes here.)"""

from tools.mutate import MUTANTS, ROOT


def test_every_mutant_applies_once_to_todays_code_and_names_tests_that_exist():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        text = (ROOT / m.path).read_text()
        assert text.count(m.old) == 1, f"{m.name}: update it to today's {m.path}"
        assert m.old != m.new and text.replace(m.old, m.new) != text
        files = [t for t in m.tests if t.endswith(".py")]
        assert files and all((ROOT / t).is_file() for t in files), m.name
