"""Command-line adapters: parse arguments, call the core, print, map errors to exit codes."""
