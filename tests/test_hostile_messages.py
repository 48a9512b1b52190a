"""Refusals that name only what the user gave, and say the cause: a default backend is not called an option
given, and two scenario files of one stem are told apart from one file given twice."""
import pytest

from pitcheck import PitcheckError
from pitcheck.trajectory import RunConfig


def test_a_sharded_run_on_the_default_backend_is_not_told_to_drop_an_option_it_never_gave():
    with pytest.raises(PitcheckError) as info:
        RunConfig(shards=2, vocab=32, dim=4).validate()
    message = str(info.value)
    assert "drop --backend" not in message and "not --backend" not in message, message
    assert "precision fp64 runs on numpy by default; give --backend torch" in message, message


def test_a_sharded_run_on_a_backend_given_names_it():
    with pytest.raises(PitcheckError, match="not --backend numpy; give --backend torch"):
        RunConfig(backend="numpy", shards=2, vocab=32, dim=4).validate()
