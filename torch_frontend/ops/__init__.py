"""torch.ops.twinengine.* op families."""
