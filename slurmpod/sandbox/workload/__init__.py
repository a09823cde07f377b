"""The sandbox's emulated trainer: a stand-in for Megatron-LM that runs on CPUs with numpy,
run inside sandbox jobs (docs/workload.md).

`EMULATOR_MODULE` is the one spelling of its `python -m` path: the demo's run spec and the
tests' command lines (`tests/helpers.py`: `EMU_MODULE`, `EMU`) are built from it.
"""

EMULATOR_MODULE = "slurmpod.sandbox.workload.megatron_emu"
