"""The Python API's verbs on arguments of the wrong type: a one-line PitcheckError naming the argument and the
type it takes, before anything is made (not an AttributeError, TypeError or ValueError from deep inside, nor a
string iterated letter by letter)."""
from pathlib import Path

import pytest

import pitcheck
from pitcheck import PitcheckError
from pitcheck.trajectory import RunConfig

SMALL = RunConfig(vocab=16, dim=4, steps=2, records_per_decade=4)

TINY = """
[scenario.tiny]
backend = "numpy"
precision = "fp64"
steps = 2
vocab = 16
dim = 4
[scenario.tiny.budget]
orthonormality = 1.0
"""


@pytest.mark.parametrize("call, message", [
    (lambda out: pitcheck.run("x", out), "run: config must be a pitcheck.RunConfig, got str 'x'"),
    (lambda out: pitcheck.run(SMALL, None), "run: out must be a directory path"),
    (lambda out: pitcheck.run(SMALL, out, resume="yes"), "run: resume must be True or False"),
    (lambda out: pitcheck.compare(out, "quick"), "compare: grid must be a pitcheck.verbs.compare.Grid"),
    (lambda out: pitcheck.compare(None, "quick"), "compare: out must be a directory path"),
    (lambda out: pitcheck.bench(shapes="64x8"), "bench: shapes must be a list of \\(V, D\\) pairs"),
    (lambda out: pitcheck.bench(shapes=[64, 8]), "bench: each of shapes must be a \\(V, D\\) pair"),
    (lambda out: pitcheck.bench(shapes=[(4, 8)]), "bench: shape 4x8: need 1 <= D <= V"),
    (lambda out: pitcheck.bench(retractions="qr"), "bench: retractions must be a list"),
    (lambda out: pitcheck.stress(5), "stress: files must be a path or a list of paths, got int 5"),
    (lambda out: pitcheck.stress([5]), "stress: each of files must be a path"),
    (lambda out: pitcheck.stress(None, out=3), "stress: out must be a path"),
])
def test_a_verb_refuses_an_argument_of_the_wrong_type_in_one_line(tmp_path, call, message):
    out = tmp_path / "out"
    with pytest.raises(PitcheckError, match=message) as info:
        call(out)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_stress_takes_a_single_path_as_one_file(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(TINY, encoding="utf-8")
    for given in (str(f), f):
        result = pitcheck.stress(given)
        assert [r.scenario.name for r in result.results] == ["tiny"] and result.held
    # and a single --only name as one name
    assert [r.scenario.name for r in pitcheck.stress(f, only="tiny").results] == ["tiny"]


def test_a_relative_single_path_is_not_read_letter_by_letter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.toml").write_text(TINY, encoding="utf-8")
    assert pitcheck.stress("s.toml").held
