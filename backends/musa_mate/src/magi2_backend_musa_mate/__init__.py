"""magi2-backend-musa-mate: MATE packed varlen attention on Moore Threads MUSA GPUs.

Importing this package imports neither MATE, torch_musa nor torchada: the descriptor
(:mod:`magi2_backend_musa_mate.plugin`) is data, and the kernel object
(:mod:`magi2_backend_musa_mate.provider`) imports them on first use, on MUSA only.
"""

__version__ = "0.1.0"
