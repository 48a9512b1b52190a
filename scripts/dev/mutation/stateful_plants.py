"""The one-line plants of the stateful placements (results/fp8/STATEFUL.md): each applied in place,
tests/numerics/test_placement_stateful.py run, the file restored; prints the tests each plant turned red (every plant
must turn one red). Run from the repository root with the venv's python; names (P1 ...) pick a subset."""
import subprocess, sys, re
PLANTS = [
 ("P1 measuring advances the histories (no copy)", "pitcheck/numerics/quantisers.py",
  "operands = tuple(copy.deepcopy(self.recipes[r]) for r in LOGITS_ROLES)", "operands = tuple(self.recipes[r] for r in LOGITS_ROLES)"),
 ("P2 the step's forward logits GEMM not cast", "pitcheck/model/engine.py",
  "            self.quantisers.forward_logits(self.model.Z, self.model.L)", "            pass"),
 ("P3 one delayed recipe shared by all moments", "pitcheck/numerics/quantisers.py",
  "                self.recipes[key] = get_recipe(self.placement.moments, **self.placement.options)",
  "                self.recipes[key] = self.recipes.get(keys[0]) or get_recipe(self.placement.moments, **self.placement.options)"),
 ("P4 checkpoint leaves the quantiser state out", "pitcheck/model/engine.py",
  '        d.update({f"quantiser_{k}": v for k, v in self.quantisers.state_dict().items()})', "        pass"),
 ("P5 restore leaves the histories as they are", "pitcheck/model/engine.py",
  "        self.quantisers.restore(quantisers)", "        pass"),
 ("P6 load drops the history", "pitcheck/numerics/quantisers.py",
  '            r.history = [float(a) for a in d[f"{role}_history"][:filled]]', "            r.history = []"),
 ("P7 SR key without the step", "pitcheck/numerics/quantisers.py",
  "np.random.SeedSequence([seed, step, index])", "np.random.SeedSequence([seed, index])"),
 ("P8 SR key without the tensor index", "pitcheck/numerics/quantisers.py",
  "np.random.SeedSequence([seed, step, index])", "np.random.SeedSequence([seed, step])"),
 ("P9 SR placement rounds to nearest", "pitcheck/numerics/quantisers.py",
  'rounding="stochastic" if stochastic else "nearest"', 'rounding="nearest"'),
 ("P10 moments through a fresh recipe each step (scale 1 forever)", "pitcheck/numerics/quantisers.py",
  "        return self.recipes[key].fake_quant(x, axis=-1)", "        return get_recipe(self.placement.moments, **self.placement.options).fake_quant(x, axis=-1)"),
 ("P11 SR on any role accepted", "pitcheck/numerics/placement.py",
  '        if unknown or (self.stochastic and not self.gradients):', "        if False:"),
 ("P12 SR ignores the run's seed", "pitcheck/numerics/quantisers.py",
  "stochastic_rng(self.seed, step, index) if stochastic else None", "stochastic_rng(0, step, index) if stochastic else None"),
 ("P13 SR from unseeded entropy", "pitcheck/numerics/quantisers.py",
  "    return np.random.default_rng(np.random.SeedSequence([seed, step, index]))", "    return np.random.default_rng()"),
 ("P14 sharded runs accept stateful placements", "pitcheck/trajectory/config.py",
  '        (bool(policy.placement), f"applies no placement', '        (False, f"applies no placement'),
 ("P15 the 16-step window dropped (TE default 1024)", "pitcheck/numerics/placement.py",
  'DELAYED_OPTIONS = (("history_len", 16), ("algo", "max"))', 'DELAYED_OPTIONS = ()'),
]
only = sys.argv[1:]
for name, path, old, new in PLANTS:
    if only and name.split()[0] not in only:
        continue
    text = open(path).read()
    assert text.count(old) == 1, (name, old)
    open(path, "w").write(text.replace(old, new))
    try:
        out = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/numerics/test_placement_stateful.py",
                              "-k", "not sigkill" if "P4" not in name else ""],
                             capture_output=True, text=True).stdout
    finally:
        open(path, "w").write(text)
    failed = sorted(set(re.findall(r"FAILED tests/numerics/test_placement_stateful.py::(\S+)", out)))
    print(name, "->", failed or "NOTHING RED", "|", out.strip().splitlines()[-1])
