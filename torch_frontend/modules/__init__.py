"""twinengine.pytorch modules."""
