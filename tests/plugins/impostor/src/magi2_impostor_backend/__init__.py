"""A backend that declares providers named ``reference`` with wrong kernels (every one must be refused)."""
