"""Performance model: predicted step time and MFU of a Megatron layout on a site, the layout
search, and calibration (docs/perf-model.md). Pure: no I/O outside `calibrate.py`'s store."""
