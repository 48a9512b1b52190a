"""Resuming with options that differ from the run's: the refusal says what the run was written with and the
options that resume it, and calls config keys unknown only when this pitcheck does not know them (--force,
which such a message suggests, erases the run)."""
from dataclasses import replace

import pytest

from pitcheck import PitcheckError
from pitcheck.trajectory import RunConfig, run
from pitcheck.trajectory.checkpoint import config_differences

SMALL = RunConfig(backend="torch", precision="fp32", vocab=32, dim=4, steps=2, records_per_decade=4, device="cpu",
                  shadow=False)


def test_a_sharded_run_resumed_without_shards_is_told_how_to_resume(tmp_path):
    out = tmp_path / "run"
    run(replace(SMALL, shards=2), out, progress=False)
    with pytest.raises(PitcheckError) as info:
        run(replace(SMALL, steps=4), out, resume=True, progress=False)
    message = str(info.value)
    assert "\n" not in message and "does not know" not in message, message
    assert "written with shards=2" in message and "--shards 2" in message, message


def test_an_unsharded_run_resumed_with_shards_names_shards_alone(tmp_path):
    out = tmp_path / "run"
    run(SMALL, out, progress=False)
    with pytest.raises(PitcheckError, match=r"config differs in shards: .*shards=1.*--shards 1$"):
        run(replace(SMALL, steps=4, shards=2), out, resume=True, progress=False)
    with pytest.raises(PitcheckError, match=r"config differs in shadow: .*resume it with --no-shadow$"):
        run(replace(SMALL, steps=4, shadow=True), out, resume=True, progress=False)


def test_a_key_this_pitcheck_does_not_know_is_still_called_unknown(tmp_path):
    manifest = {"config": {**SMALL.to_json(), "warp_factor": 9}}
    with pytest.raises(PitcheckError, match=r"config keys this pitcheck does not know \(warp_factor\)"):
        config_differences(SMALL, manifest, (), tmp_path)
    assert config_differences(SMALL, {"config": {**SMALL.to_json(), "shards": 1, "pad_multiple": 0}}, (),
                              tmp_path) == []
