"""pitcheck.infra.threads' policy: one count per process (--threads, or the measured default), a pool's workers
pinned to their share or to the chosen count, a block of the Python API pinned and put back after."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pitcheck.infra import executors, threads
from pitcheck.cli import build_parser, main, VERBS
from pitcheck.infra.errors import PitcheckError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_counts(task: dict) -> dict:
    import torch
    from threadpoolctl import threadpool_info

    return {"torch": torch.get_num_threads(), "blas": sorted({i["num_threads"] for i in threadpool_info()}),
            "env": os.environ.get("OMP_NUM_THREADS")}


def worker_policy_counts(task: dict) -> dict:
    """What a run inside a pool worker computes with: its verb's thread_policy() block, no count given."""
    import torch

    with threads.thread_policy():
        return {"torch": torch.get_num_threads(), "policy": threads.policy_threads()}


def test_policy_threads_default_explicit_and_bad(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.delenv(threads.POLICY_VARIABLE, raising=False)
    assert threads.policy_threads() == threads.DEFAULT_THREADS == 1
    assert threads.policy_threads(3) == 3
    monkeypatch.setattr(threads, "_chosen", 2)
    assert threads.policy_threads() == 2 and threads.policy_threads(1) == 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(PitcheckError, match="--threads must be a positive integer"):
            threads.policy_threads(bad)


def test_a_child_process_inherits_the_parents_chosen_count(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setenv(threads.POLICY_VARIABLE, "3")
    assert threads.policy_threads() == 3
    for junk in ("0", "-1", "x", ""):  # not a count: the default
        monkeypatch.setenv(threads.POLICY_VARIABLE, junk)
        assert threads.policy_threads() == threads.DEFAULT_THREADS
    monkeypatch.setattr(threads, "_chosen", 2)  # this process's own choice comes first
    monkeypatch.setenv(threads.POLICY_VARIABLE, "3")
    assert threads.policy_threads() == 2


def test_worker_threads_default_capped_by_the_share_unless_chosen(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(threads, "_chosen", None)
    assert [threads.worker_threads(w) for w in (1, 2, 3, 8, 16)] == [1, 1, 1, 1, 1]
    monkeypatch.setattr(threads, "DEFAULT_THREADS", 4)  # a larger default never oversubscribes the cores
    assert [threads.worker_threads(w) for w in (1, 2, 3, 8, 16)] == [4, 4, 2, 1, 1]
    monkeypatch.setattr(threads, "_chosen", 3)
    assert threads.worker_threads(2) == 3


def test_thread_policy_block_pins_torch_and_blas_and_puts_them_back(monkeypatch):
    import torch
    from threadpoolctl import threadpool_info

    monkeypatch.setattr(threads, "_chosen", None)
    before = torch.get_num_threads()
    blas_before = [i["num_threads"] for i in threadpool_info()]
    target = 2 if before != 2 else 3
    with threads.thread_policy(target):
        assert torch.get_num_threads() == target
        assert {i["num_threads"] for i in threadpool_info()} == {target}
    assert torch.get_num_threads() == before
    assert [i["num_threads"] for i in threadpool_info()] == blas_before
    monkeypatch.setattr(threads, "_chosen", target)
    with threads.thread_policy():  # no argument: the process's chosen count, not the default
        assert torch.get_num_threads() == target


def test_apply_thread_policy_pins_the_process_and_its_pools():
    """In a fresh process (the policy is process-wide): --threads 2's count for the process and for each
    worker of a pool it starts; without a count, the default for the process and the cores' share for workers."""
    code = (
        "import json, sys; from pitcheck.infra import threads, executors\n"
        "from tests.infra.test_threads_policy import worker_counts\n"
        "arg = json.loads(sys.argv[1]); threads.apply_thread_policy(arg)\n"
        "here = worker_counts({}); out = []\n"
        "executors.map_tasks(worker_counts, [{}, {}], out.append, workers=2)\n"
        "from tests.infra.test_threads_policy import worker_policy_counts; inside = []\n"
        "executors.map_tasks(worker_policy_counts, [{}, {}], inside.append, workers=2)\n"
        "import subprocess; child = subprocess.run([sys.executable, '-c', 'from pitcheck.infra import threads; "
        "print(threads.policy_threads())'], capture_output=True, text=True).stdout.strip()\n"
        "print(json.dumps({'here': here, 'worker': out[0], 'inside': inside[0], 'child': int(child)}))\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    for arg, process, worker in ((2, 2, 2), (None, 1, 1)):
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["here"]["torch"] == process and got["here"]["blas"] == [process]
        assert got["worker"]["torch"] == worker and got["worker"]["blas"] == [worker]
        assert got["worker"]["env"] == str(worker)
        # a run inside a worker keeps the worker's count; a process started here gets this process's
        assert got["inside"] == {"torch": worker, "policy": worker}
        assert got["child"] == process


def test_every_verb_takes_threads_and_refuses_a_bad_count(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for verb in VERBS:
        assert "--threads" in sub.choices[verb]._option_string_actions, verb
    for bad in ("0", "-2", "x"):
        with pytest.raises(SystemExit) as exc:
            main(["plot", "--threads", bad, "run", "--out", "x.png"])
        assert exc.value.code == 2
        assert "--threads: must be a positive integer" in capsys.readouterr().err


def test_executors_hand_the_chosen_count_to_workers(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", 3)  # more than a share of the cores: an explicit override
    out = []
    executors.map_tasks(worker_counts, [{}, {}], out.append, workers=2)
    assert [(r["torch"], r["env"]) for r in out] == [(3, "3")] * 2
