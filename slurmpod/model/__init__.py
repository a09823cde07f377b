"""Pure data model: frozen dataclasses and pure functions, no I/O."""
