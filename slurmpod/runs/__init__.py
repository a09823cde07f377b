"""Runs as users see and steer them: `slurmpod runs`, `logs` and `cancel` (docs/runs.md).

`attempts` parses the job script's `RUN_DIR/.slurmpod/attempts.jsonl` (pure), `files` reads a
run's files through a CommandRunner in bounded pieces, `view` turns a job, its attempts and its
log tail into one row (pure), and `ops` ties them to a SlurmBackend.
"""
