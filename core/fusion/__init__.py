"""Fusible operations: basic-op descriptions and the fusion planner (framework-free).

Both frontends' ``Sequential`` run the plan this package computes; neither decides a fusion.
"""

from .ops import OpDesc, check_extra_inputs, check_op_api, check_sequential, reject_member, reject_quantized_output
from .planner import KernelGroup, plan, quantization_source

__all__ = ["KernelGroup", "OpDesc", "check_extra_inputs", "check_op_api", "check_sequential", "reject_member", "reject_quantized_output", "plan", "quantization_source"]
