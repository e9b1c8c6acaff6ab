"""Operator math, shared checks and numerical acceptance helpers; validation lives in the op specs (magi2_core.ops)."""
