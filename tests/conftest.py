import signal

import numpy as np
import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (the 200-kill fault injections, the full mutation run, "
                          "full-size certificates)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes-long runs kept out of CI; skipped unless --runslow or -m slow")
    # a runner started in the background of a script (`cmd &`) ignores SIGINT and every child inherits that;
    # the Ctrl-C tests need children that take SIGINT as a terminal's foreground job does (a Python handler,
    # unlike SIG_IGN, is not inherited: children start with the default)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (or -m slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
