"""pitcheck from Python: validate your PIT module, simulate a trajectory, judge drift budgets.

    python api.py            (beside mypit.py and budgets.toml)

Every verb is one function of `import pitcheck`; bad input raises pitcheck.PitcheckError with the
message the CLI prints.
"""
import sys
import tempfile

import pitcheck


def main() -> int:
    # 1. Is the module correct? (a child process with a time limit; float32, small size for speed)
    result = pitcheck.validate("mypit.py:make", "float32", vocab=64, dim=8, steps=20)
    print(result.table())
    if result.exit_status != 0:
        return result.exit_status

    # 2. One trajectory of pitcheck's own PIT head in bf16-mixed, with a float64 shadow
    config = pitcheck.RunConfig(precision="bf16-mixed", retraction="qr", steps=50, vocab=64, dim=8)
    with tempfile.TemporaryDirectory() as out:
        rows = pitcheck.run(config, out + "/run", progress=False)
    last = rows[-1]
    print(f"step {last['step']}: ||Z^T Z - I||_F = {last['orthonormality']:.3g}, "
          f"||W E - I||_F = {last['pinv_drift']:.3g}, shadow_Z = {last['shadow_Z']:.3g}")

    # 3. Drift budgets on the module (budgets.toml, target = "mypit.py:make"): .exit_status as validate's
    with tempfile.TemporaryDirectory() as out:
        outcome = pitcheck.stress(["budgets.toml"], out=out)
    print(f"budgets: {'held' if outcome.exit_status == 0 else 'BROKEN'}")
    return outcome.exit_status


if __name__ == "__main__":
    sys.exit(main())
