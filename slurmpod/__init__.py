"""slurmpod: Slurm toolkit for AI clusters made of whole 8-GPU nodes on rail-optimised fabrics."""

__version__ = "0.1.0"
