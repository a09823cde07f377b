"""A real Slurm on one machine: munged, MariaDB, slurmdbd, slurmctld and one slurmd per site node.

`slurmpod.sandbox.cluster.Sandbox` is the API; `slurmpod sandbox up|status|env|down` the CLI.
Everything lives under one state directory and listens on 127.0.0.1 only.
"""
