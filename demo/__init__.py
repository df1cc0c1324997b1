"""twinengine demo: a small MLP language model trained side by side in PyTorch (compiled) and
JAX (jitted) through the same low-precision kernels (``python -m demo --help``)."""
