"""pitcheck.verbs.convert.study's files: the committed smollm2.csv reads back into the curves that wrote it,
so a figure can draw another precision's study beside this one's (scripts/studies/smollm2_study.py --also)."""
import math

import pytest

pytest.importorskip("torch")
from pitcheck import PitcheckError  # noqa: E402
from pitcheck.verbs.convert.continued import COLUMNS  # noqa: E402
from pitcheck.verbs.convert.study import read_summary, summary_csv  # noqa: E402


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


def test_labels_name_the_mode_except_the_default():
    from pitcheck.verbs.convert.continued import ContinuedConfig
    from pitcheck.verbs.convert.study import parse_heads, run_label

    assert run_label(ContinuedConfig(head="pit")) == "pit-qr_fp32"  # as before the modes existed
    assert run_label(ContinuedConfig(head="pit"), with_mode=True) == "pit-qr-keep-embedding_fp32"
    assert run_label(ContinuedConfig(head="pit", mode="keep-head")) == "pit-qr-keep-head_fp32"
    assert run_label(ContinuedConfig(head="tied", mode="keep-head"), with_mode=True) == "tied_fp32"
    assert parse_heads("tied,pit-cholqr2") == [("tied", ""), ("pit", "cholqr2")]
    with pytest.raises(PitcheckError, match="unknown conversion mode"):
        ContinuedConfig(mode="keep-all").check()


def test_a_modes_figure_draws_the_baselines_of_another_study_renamed_and_cut(tmp_path):
    """write_study: the csv holds this study's runs only; the figure draws the named runs of --also, cut at
    the study's last step, OLD=NEW renamed (the baselines and the default mode reused from a longer study)."""
    from pitcheck.verbs.convert import study
    from pitcheck.verbs.convert.continued import metrics_bytes

    row = {k: 1.0 for k in COLUMNS[1:]}
    runs = tmp_path / "runs"
    for name in ("pit-qr-keep-head_fp32", "pit-qr-sqrt_fp32", "elsewhere_fp32"):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.csv").write_bytes(metrics_bytes([{"step": 0, **row}]))
    other = tmp_path / "steps300.csv"
    other.write_bytes(study.summary_csv({label: [{"step": s, **row} for s in (0, 100, 200)]
                                         for label in ("tied_fp32", "untied_fp32", "pit-qr_fp32", "pit-cholqr2_fp32")}))
    drawn = {}
    real_plot = study.plot_study
    study.plot_study = lambda out, curves, stem, panels: drawn.update(curves) or []
    try:
        study.write_study(tmp_path / "out", runs, also=other, labels={"pit-qr-keep-head_fp32", "pit-qr-sqrt_fp32"},
                          also_labels=["tied_fp32", "pit-qr_fp32=pit-qr-keep-embedding_fp32"], also_steps=100)
    finally:
        study.plot_study = real_plot
    assert sorted(drawn) == ["pit-qr-keep-embedding_fp32", "pit-qr-keep-head_fp32", "pit-qr-sqrt_fp32", "tied_fp32"]
    assert [r["step"] for r in drawn["tied_fp32"]] == [0, 100]
    assert sorted(read_summary(tmp_path / "out" / "smollm2.csv")) == ["pit-qr-keep-head_fp32", "pit-qr-sqrt_fp32"]


def test_several_studies_are_drawn_and_a_precision_is_a_line_style(tmp_path, monkeypatch):
    """--also given twice draws both files' named runs; a head keeps its colour across precisions, the
    precision sets the line style."""
    from pitcheck.verbs.convert import study
    from pitcheck.verbs.convert.continued import metrics_bytes

    row = {k: 1.0 for k in COLUMNS[1:]}
    runs = tmp_path / "runs"
    for name in ("pit-qr-sqrt_fp32", "pit-qr-sqrt_bf16-mixed"):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.csv").write_bytes(metrics_bytes([{"step": 0, **row}, {"step": 10, **row}]))
    files = []
    for precision in ("fp32", "bf16-mixed"):
        files.append(tmp_path / f"{precision}.csv")
        files[-1].write_bytes(study.summary_csv({f"tied_{precision}": [{"step": 0, **row}]}))
    lines = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **k: lines.append((k["label"], k["color"], k["linestyle"])) or real_plot(self, *a, **k))
    study.write_study(tmp_path / "out", runs, also=files, also_labels=["tied_fp32", "tied_bf16-mixed"],
                      panels=study.PANELS[:1])
    drawn = dict((label, (colour, style)) for label, colour, style in lines)
    assert set(drawn) == {"tied_fp32", "tied_bf16-mixed", "pit-qr-sqrt_fp32", "pit-qr-sqrt_bf16-mixed"}
    assert drawn["tied_fp32"][0] == drawn["tied_bf16-mixed"][0] != drawn["pit-qr-sqrt_fp32"][0]
    assert drawn["pit-qr-sqrt_fp32"][0] == drawn["pit-qr-sqrt_bf16-mixed"][0]
    assert drawn["tied_fp32"][1] == drawn["pit-qr-sqrt_fp32"][1] != drawn["pit-qr-sqrt_bf16-mixed"][1]


def test_existing_only_resumes_what_is_there_and_starts_nothing(tmp_path, monkeypatch):
    from pitcheck.verbs.convert import study

    (tmp_path / "pit-qr-sqrt_fp32").mkdir()
    trained = []
    monkeypatch.setattr(study, "continued", lambda out, config, model=None, progress=None: trained.append(out.name))
    monkeypatch.setattr("pitcheck.sources.pretrained.body.load_smollm2", lambda: None)
    seconds = study.run_study(tmp_path, precisions=("fp32", "bf16-mixed"), heads=[("pit", "qr")],
                              modes=["sqrt", "keep-head"], existing_only=True, steps=1)
    assert trained == ["pit-qr-sqrt_fp32"] and list(seconds) == ["pit-qr-sqrt_fp32"]
