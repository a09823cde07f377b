"""Megatron-LM run specs: model and layout arithmetic (FLOPs, memory), validation and placement.

Public entry points: `runspec` (the run spec model and the resolved `ModelConfig`), `args`
(import from a Megatron command line, launch script or `arguments` dump), `flops`, `memory`,
`validate`, `placement` and `plan.make_plan`.
"""
