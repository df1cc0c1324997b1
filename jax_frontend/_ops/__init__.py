"""Internal per-family JAX bindings (FFI calls); the public fusible ops live in twinengine.jax.ops."""
