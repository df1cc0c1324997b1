"""Internal per-family torch bindings (torch.ops.twinengine.*); the public fusible ops live in twinengine.pytorch.ops."""
