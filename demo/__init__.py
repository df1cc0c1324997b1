"""twinengine demos (the README's main job).

``python -m demo``: a small MLP language model trained side by side in PyTorch (compiled) and
JAX (jitted) through the same low-precision kernels (``--help`` for options).
``python -m demo.quantize_table``: quantize one tensor with every recipe in both frameworks.
"""
