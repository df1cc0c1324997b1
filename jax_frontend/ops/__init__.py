"""twinengine.jax op families."""
