"""pitcheck.sources.pretrained.study's files: the committed smollm2.csv reads back into the curves that wrote it,
so a figure can draw another precision's study beside this one's (scripts/smollm2_study.py --also)."""
import math

import pytest

pytest.importorskip("torch")
from pitcheck import PitcheckError  # noqa: E402
from pitcheck.sources.pretrained.continued import COLUMNS  # noqa: E402
from pitcheck.sources.pretrained.study import read_summary, summary_csv  # noqa: E402


def test_a_study_csv_reads_back_exactly(tmp_path):
    curves = {"tied_fp32": [{"step": 0, **{k: (math.nan if k == "train_loss" else 1 / 3) for k in COLUMNS[1:]}},
                            {"step": 20, **{k: 0.1 * i for i, k in enumerate(COLUMNS[1:])}}],
              "pit-qr_bf16-mixed": [{"step": 0, **{k: 2.0**-40 for k in COLUMNS[1:]}}]}
    path = tmp_path / "smollm2.csv"
    path.write_bytes(summary_csv(curves))
    back = read_summary(path)
    assert list(back) == list(curves)
    for label, rows in curves.items():
        for want, got in zip(rows, back[label]):
            assert got["step"] == want["step"] and isinstance(got["step"], int)
            for k in COLUMNS[1:]:
                assert (math.isnan(got[k]) and math.isnan(want[k])) or got[k] == want[k], (label, k)


def test_an_empty_study_csv_is_refused(tmp_path):
    path = tmp_path / "smollm2.csv"
    path.write_bytes(summary_csv({}))
    with pytest.raises(PitcheckError, match="no study rows"):
        read_summary(path)
