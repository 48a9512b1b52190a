"""The one-line plants of batched cells (issue 16, item 3; results/bench/BATCHED.md): each applied in place, the
tests of tests/test_batched.py that should catch it run, the file restored; prints KILLED or SURVIVED per
plant (every plant must be killed). Run from the repository root with the venv's python; a word of a plant's
description picks a subset. A plant's selection may name its own test file ("file.py::-k words")."""
import subprocess, sys
PLANTS = [
 ("seeds: every cell's gradients drawn with the first cell's seed", "pitcheck/trajectory/batched.py",
  "GZ, GL = stacked_gradients([(names, t.config.seed,", "GZ, GL = stacked_gradients([(names, self.runs[0].config.seed,",
  "a_batch_writes and qr-fp32"),
 ("lr: the first cell's learning rate applied to all", "pitcheck/batched_engine.py",
  "lrs = np.array([e.settings.lr for e in engines]", "lrs = np.array([engines[0].settings.lr for e in engines]",
  "a_batch_writes and qr-fp32"),
 ("qr's result left column-major", "pitcheck/batched_retractions.py",
  "return ops.contiguous(Q * ops.sign_nonzero(ops.diagonal(R))[..., None, :]), _none_failed(Z)",
  "return Q * ops.sign_nonzero(ops.diagonal(R))[..., None, :], _none_failed(Z)", "a_batch_writes and qr-fp32"),
 ("small products through torch's bmm loop", "pitcheck/batched_retractions.py",
  "TORCH_BMM_OWN_LOOP_BELOW = 400", "TORCH_BMM_OWN_LOOP_BELOW = 0", "odd_dimensions"),
 ("optimizer step count not advanced", "pitcheck/trajectory/batched.py",
  "engine.opt_step = start + since", "engine.opt_step = start", "a_batch_writes and qr-fp32"),
 ("a failed cell handed back at its state after the step", "pitcheck/trajectory/batched.py",
  "self.give_back(k, previous=True)", "self.give_back(k, previous=False)", "event"),
 ("the shadow not stepped", "pitcheck/trajectory/batched.py",
  "failed |= self.shadow.step(GZ, GL, skip=failed)", "pass", "a_batch_writes and qr-fp32"),
 ("the shadow not told which cells its model failed", "pitcheck/trajectory/batched.py",
  "self.shadow.step(GZ, GL, skip=failed)", "self.shadow.step(GZ, GL)", "tests/test_stack_failures.py::told"),
 ("cholqr's failed factor left in the stack's solve", "pitcheck/batched_retractions.py",
  "    C = _replace_failed(C, failed, ops)\n    return ops.contiguous", "    return ops.contiguous",
  "tests/test_stack_failures.py::stuck_cell"),
 ("a failed factor replaced in row-major layout", "pitcheck/batched_retractions.py",
  "out = C.clone() if ops.torch else C.copy(order=\"K\")", "out = C.contiguous() if ops.torch else C.copy()",
  "tests/test_stack_failures.py::leaves_the_others_bits"),
 ("a raising stack counts every cell as failing", "pitcheck/trajectory/batched.py",
  "            if raised and len(run.events) == events:\n                self.failing[k] = 0\n", "",
  "tests/test_stack_failures.py::raise"),
 ("a raising stack never blames the run whose step alone fails", "pitcheck/trajectory/batched.py",
  "        if blamed:\n            self.raising = 0\n", "", "tests/test_stack_failures.py::raise"),
 ("a stack that keeps raising never gives up", "pitcheck/trajectory/batched.py",
  " or self.raising >= ALONE_AFTER_FAILURES:", ":", "tests/test_stack_failures.py::keeps_raising"),
 ("cayley's singular system raises for the stack", "pitcheck/batched_retractions.py",
  "x, info = self.torch.linalg.solve_ex(a, b)",
  "x, info = self.torch.linalg.solve(a, b), self.torch.zeros(a.shape[0], dtype=self.torch.int32)",
  "tests/test_stack_failures.py::singular_cayley"),
 ("polar-gram's overflowed Gram into the stack's eigh", "pitcheck/batched_retractions.py",
  "w, Q = ops.eigh(_replace_failed(gram, overflowed, ops))", "w, Q = ops.eigh(gram)",
  "tests/test_stack_failures.py::overflowing"),
 ("precision left out of the batch key", "pitcheck/sweep/batches.py",
  "return (config.backend, config.precision, config.retraction,", "return (config.backend, config.retraction,",
  "sweep_hands_out"),
 ("softplus on the stacked diagonal", "pitcheck/batched_engine.py",
  "ops.diag_embed(ops.on_diagonals(ops.base.softplus, raw))", "ops.diag_embed(ops.base.softplus(ops.diagonal(raw)))",
  "odd_dimensions"),
 ("L's diagonal breakdown not checked", "pitcheck/batched_engine.py",
  "return ~(ops.finite(self.Z) & ops.finite(self.L) & positive)", "return ~(ops.finite(self.Z) & ops.finite(self.L))",
  "event"),
 ("resumed runs grouped without their step", "pitcheck/trajectory/batched.py",
  "return (trajectory.step, c.backend,", "return (0, c.backend,", "different_steps"),
 ("a run's stack chosen without its policy", "pitcheck/trajectory/batched.py",
  "return (trajectory.step, c.backend, c.precision,", "return (trajectory.step, c.backend,", "different_policies"),
 ("loss scale not divided out in the stack", "pitcheck/batched_engine.py",
  "grads = {k: self._unscale(g) for k, g in grads.items()}", "pass", "loss_scaled"),
 ("loss scale never grows in the stack", "pitcheck/batched_engine.py",
  "self.scales = np.where(grow, self.scales * 2.0, self.scales)", "pass", "loss_scaled"),
 ("a rejoining cell's loss scale not taken back into the stack", "pitcheck/batched_engine.py",
  "self.scales = replaced(self.scales, engine.loss_scale)", "pass", "loss_scaled"),
 ("a handed-back cell's step alone not taken back into the stack", "pitcheck/trajectory/batched.py",
  "stack.put(k, engine)", "pass", "event or loss_scaled"),
 ("put makes the stack's state after the step every cell's state before it", "pitcheck/batched_engine.py",
  "        self.good_steps = replaced(self.good_steps, engine.good_steps)\n        self._refresh()",
  "        self.good_steps = replaced(self.good_steps, engine.good_steps)\n        self.hold()\n        self._refresh()",
  "event or loss_scaled"),
 ("a stuck run never leaves the stack", "pitcheck/trajectory/batched.py",
  "if self.failing[k] >= ALONE_AFTER_FAILURES or self.raising", "if self.raising", "event"),
 ("failures in a row not reset by a step the stack took", "pitcheck/trajectory/batched.py",
  "self.failing[k] = self.failing[k] + 1 if failed[k] else 0", "self.failing[k] += int(failed[k])", "event"),
 ("an interrupted batch does not save the runs that left it", "pitcheck/trajectory/batched.py",
  "for t, o in list(zip(self.runs, self.outcomes)) + self.alone:", "for t, o in zip(self.runs, self.outcomes):",
  "interrupted_batch"),
 ("a signal stops only the run alone it reached", "pitcheck/trajectory/batched.py",
  "        if isinstance(outcome.error, RunInterrupted):\n            for later",
  "        if False:\n            for later", "signal_stops"),
]
for why, path, old, new, sel in [p for p in PLANTS if len(sys.argv) < 2 or sys.argv[1] in p[0]]:
    src = open(path).read()
    assert src.count(old) == 1, (why, old)
    open(path, "w").write(src.replace(old, new))
    try:
        tests, sel = sel.split("::") if "::" in sel else ("tests/test_batched.py", sel)
        r = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "-x", tests, "-k", sel],
                           capture_output=True, text=True, timeout=600)
        tail = [l for l in r.stdout.splitlines() if l.startswith("FAILED")][:1]
        print(("KILLED " if r.returncode != 0 else "SURVIVED ") + why + " :: " + (tail[0] if tail else r.stdout.splitlines()[-1]), flush=True)
    finally:
        open(path, "w").write(src)
