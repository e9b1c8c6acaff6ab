"""magi2-backend-cuda-fa4: MAGI-2 attention through FlashAttention-4 on NVIDIA Hopper and Blackwell."""

__version__ = "0.1.0"

from magi2_backend_cuda_fa4.warmup import WarmupRecord, warmup

__all__ = ["WarmupRecord", "__version__", "warmup"]
