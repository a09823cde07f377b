"""Job accounting: Megatron log parsing, per-job efficiency metrics (MFU, goodput) and hooks.

`logparse.parse_log` / `logparse.LogParser` read a log (streaming, bounded memory);
`metrics.job_metrics` turns the result into `JobMetrics`. Importing this package loads neither.
"""
