"""Bounds every interface applies alike (REST, MCP, the SDK's server, the CLI, the L3 layer): stated once
here, in a module with no imports, so the CLI can read them without loading the search path."""

__all__ = ["EPISODES_K_MAX", "SEARCH_K_MAX"]

SEARCH_K_MAX = 50  # the most drawers one search may ask for
EPISODES_K_MAX = 20  # the most episodes one search may add (include_episodes)
