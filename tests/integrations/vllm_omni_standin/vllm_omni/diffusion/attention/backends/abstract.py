"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/attention/backends/abstract.py``.

Only ``AttentionMetadata.extra``, the dict through which MAGI-2 hands its varlen handler, Ulysses
split sizes and sink logits to its attention kernel. Upstream's other metadata fields are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AttentionMetadata:
    extra: dict[str, Any] = field(default_factory=dict)
