import sys, pathlib; sys.path.insert(0, str(pathlib.Path(__file__).parent))


def pytest_addoption(parser):
    parser.addoption("--fuzz-budget", type=int, default=20,
                     help="examples per property of the tests/fuzz fuzzer (small in CI; raise it for long runs)")
