"""Operator contracts: validation, the problem a call poses, and numerical acceptance rules."""
