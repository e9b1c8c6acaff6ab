"""magi2-backend-triton: portable Triton kernels for MAGI-2."""
