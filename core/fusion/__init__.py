"""Fusible operations: basic-op descriptions and the fusion planner (framework-free).

Both frontends' ``Sequential`` run the plan this package computes; neither decides a fusion.
"""

from .ops import OpDesc, check_op_api, check_sequential
from .planner import KernelGroup, plan

__all__ = ["KernelGroup", "OpDesc", "check_op_api", "check_sequential", "plan"]
