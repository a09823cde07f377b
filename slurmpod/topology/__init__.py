"""Topology: site -> fabric plan and every Slurm/NCCL artefact (tree, blocks, gres, nodes)."""
