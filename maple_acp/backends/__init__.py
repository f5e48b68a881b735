"""Implementations of the runtime's ``AgentBackend`` protocol (the host injects one)."""

from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy

__all__ = ["DemoBackend", "demo_catalog", "demo_policy"]
