"""Environments: ToolEnv, turn parsers, and the embedded multi-hop world."""
