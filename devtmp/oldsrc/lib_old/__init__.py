"""The study's library: one file per concern (see README.md)."""
import logging

# gptqmodel pulls in torchao, whose import (through transformers) logs failed optional CUDA extensions
# on CPU-only machines, and torch logs a deprecation from it; neither concerns this study.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
