"""envbuild: verified container images for RL post-training stacks."""

__version__ = "0.1.0"
