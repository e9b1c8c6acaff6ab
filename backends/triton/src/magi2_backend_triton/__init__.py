"""magi2-backend-triton: portable Triton kernels for MAGI-2 (MoE, RMSNorm, sink correction)."""

__version__ = "0.1.0"
