"""blockdraft: block-parallel speculative drafters (the DFlash family) for Hugging Face causal LMs."""

__version__ = "0.1.0"
