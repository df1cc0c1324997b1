"""The quantize reference moved into the package as ``twinengine.testing.reference`` (public, so users
can test their own kernels against it). Import it from there; this name only re-exports it."""

from twinengine.testing.reference import *  # noqa: F401,F403
