"""Refusals that name only what the user gave, and say the cause: a default backend is not called an option
given, and two scenario files of one stem are told apart from one file given twice."""
import pytest

from pitcheck import PitcheckError
from pitcheck.trajectory import RunConfig
from tests.helpers import TINY_SCENARIO


def test_a_sharded_run_on_the_default_backend_is_not_told_to_drop_an_option_it_never_gave():
    with pytest.raises(PitcheckError) as info:
        RunConfig(shards=2, vocab=32, dim=4).validate()
    message = str(info.value)
    assert "drop --backend" not in message and "not --backend" not in message, message
    assert "precision fp64 runs on numpy by default; give --backend torch" in message, message


def test_a_sharded_run_on_a_backend_given_names_it():
    with pytest.raises(PitcheckError, match="not --backend numpy; give --backend torch"):
        RunConfig(backend="numpy", shards=2, vocab=32, dim=4).validate()




def test_two_scenario_files_of_one_stem_are_told_apart_and_a_stem_id_says_why(tmp_path, capsys):
    from pitcheck.cli import stress as stress_cli
    from tests.helpers import stress_args

    files = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        files.append(tmp_path / folder / "s.toml")
        files[-1].write_text(TINY_SCENARIO, encoding="utf-8")
    assert stress_cli.main(stress_args(files, json=tmp_path / "r.json")) == 0
    assert "a/s::t" in capsys.readouterr().out
    assert stress_cli.main(stress_args(files, only="s::t", json=tmp_path / "r.json")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "share the stem 's'" in err and "a/s::t, b/s::t" in err, err
    assert "bare name 't'" in err, err
