"""8 host CPU devices for the sharding tests: XLA reads the flag when JAX's CPU backend starts,
so it is set before any test runs. When another test file started JAX first (the whole suite
in one process), the tests here rerun themselves in a subprocess (see _mesh.py)."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"


def pytest_configure(config):
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}".strip()
