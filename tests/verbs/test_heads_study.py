"""pitcheck.verbs.heads: the library of `pitcheck heads` refuses bad input with PitcheckError before any
cell runs, and takes the heads' names from pitcheck.model.heads. (The command run end to end: test_lm.py.)"""
import argparse

import pytest

import pitcheck.verbs.compare
from pitcheck import PitcheckError
from pitcheck.cli import heads as heads_cli
from pitcheck.model.heads import HEADS
from pitcheck.verbs import heads as heads_study


def _never(*args, **kw):
    raise AssertionError("a sweep ran: the input should have been refused first")


@pytest.mark.parametrize("kw, what", [(dict(reference=["gaussian", "lm"]), "--reference lm"),
                                      (dict(vocab=100, dim=8), "--vocab in"),
                                      (dict(precisions=["fp7"]), "fp7")])
def test_heads_raises_before_any_cell_runs(tmp_path, kw, what, monkeypatch):
    monkeypatch.setattr(pitcheck.verbs.compare, "compare", _never)
    with pytest.raises(PitcheckError, match=what) as info:
        heads_study.heads(tmp_path / "h", **kw)
    assert "error:" not in str(info.value)  # the CLI adds the prefix
    assert not (tmp_path / "h").exists()


def test_heads_are_pitchecks_heads():
    assert heads_study.HEAD_NAMES == tuple(HEADS)


def test_cli_defaults_are_the_librarys_and_out_is_under_the_working_directory():
    p = argparse.ArgumentParser()
    heads_cli.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["heads"])
    assert args.out == "pitcheck-out/heads"
    assert (args.precisions, args.retractions, args.reference) == ("fp32,bf16-mixed", "qr,cayley",
                                                                   "adaptive,dense_output+sparse_input")
    assert (args.steps, args.vocab, args.dim, args.optimizer, args.lr, args.seed) == (600, 1024, 32, "adam", 3e-3, 0)
