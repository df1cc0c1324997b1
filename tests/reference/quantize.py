"""The quantize reference moved into the package as ``twinengine.testing.reference`` (public, so users
can test their own kernels against it). Import it from there; this name is an alias of that very
module (private names included), kept for code written against the old location."""

import sys

from twinengine.testing import reference

sys.modules[__name__] = reference
