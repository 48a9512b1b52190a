"""Stateful gradient sources behind one record (pitcheck/sources/stateful.py): lm registers itself, and the run
reaches it only through the record."""
import pytest

import pitcheck.sources.lm  # noqa: F401  (registers the lm source)
from pitcheck.infra.errors import PitcheckError
from pitcheck.sources.stateful import STATEFUL_SOURCES, register_stateful, stateful_source
from pitcheck.trajectory import RunConfig


@pytest.mark.parametrize("adversary, name", [("lm", "lm"), ("gaussian, lm", "lm"), ("gaussian", None),
                                             ("gaussian,spike", None), ("lmx", None)])
def test_the_source_an_adversary_names(adversary, name):
    source = stateful_source(adversary)
    assert (source.name if source else None) == name


def test_lm_is_registered_once_with_its_config_field_and_input_file():
    lm = STATEFUL_SOURCES["lm"]
    assert lm.config_field == "lm" and list(lm.input_files) == ["vocabulary_sha256"]
    with pytest.raises(PitcheckError, match="registered twice"):
        register_stateful(lm)


def test_a_config_leaves_out_the_options_of_a_source_it_does_not_use():
    assert "lm" not in RunConfig(adversary="gaussian").to_json()
    assert RunConfig(adversary="gaussian,lm").to_json()["lm"]["seq_len"] == 32
