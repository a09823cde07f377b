"""The sandbox training workload: a stand-in for Megatron-LM that runs on CPUs with numpy."""
