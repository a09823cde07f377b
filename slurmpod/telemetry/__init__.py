"""GPU telemetry: parsers of the tools sites have (DCGM, Prometheus, Slurm, nvidia-smi), the
run-time choice among them, the monitor's sampler, and the stored schema (`schema.py`)."""
