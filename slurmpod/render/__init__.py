"""Jinja2 rendering: one environment, strict undefined, shell quoting, generated-file headers."""
