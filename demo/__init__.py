"""twinengine demos (the README's main job)."""
