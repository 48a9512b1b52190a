"""Per-call cost of pitcheck's gradient stream against its pre-change code (tests/model/test_gradient_stream_exact.py
keeps it, and holds the two bit-identical): process CPU time per gradient(...) call, one thread (runs pin one),
old and new interleaved in rounds of one process so that the ratio holds under load, minimum over rounds.
Usage: PYTHONPATH=. python scripts/measurements/gradient_stream_timing.py [ROUNDS]"""
import sys
import time

import numpy as np

from pitcheck.model.gradients import AdversaryParams, gradient
from pitcheck.infra.threads import limited_threads
from tests.model.test_gradient_stream_exact import model_pair, ref_gradient

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
params = AdversaryParams()
print(f"{'V x D':>10} {'adversary':>26} {'old us':>9} {'new us':>9} {'old/new':>8}")
with limited_threads(1):
    for V, D in [(128, 8), (2048, 64)]:
        Z, L = model_pair(V, D, 0)
        calls = 2000 if V * D < 10**4 else 100
        for names in (["gaussian"], ["dense_output", "sparse_input"]):
            best = {"old": np.inf, "new": np.inf}
            for r in range(rounds):
                for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    f = ref_gradient if which == "old" else gradient
                    t0 = time.process_time()
                    for step in range(calls):
                        f(names, Z, L, 1, step, params)
                    best[which] = min(best[which], (time.process_time() - t0) / calls)
            print(f"{f'{V} x {D}':>10} {','.join(names):>26} {best['old'] * 1e6:9.1f} {best['new'] * 1e6:9.1f} "
                  f"{best['old'] / best['new']:8.2f}", flush=True)
