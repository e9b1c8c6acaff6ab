"""magi2-backend-cuda-fa3: MAGI-2 attention through FlashAttention-3 on NVIDIA Hopper."""

__version__ = "0.1.0"
