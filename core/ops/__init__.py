"""Op descriptions: one OpDef per op, consumed by both frontends."""
