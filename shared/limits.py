"""Bounds every interface applies alike (REST, MCP, the SDK's server, the CLI, the L3 layer): stated once
here, in a module with no imports, so the CLI can read them without loading the search path."""

__all__ = ["EPISODES_K_MAX", "IDENTIFIER_MAX", "KG_FACTS_MAX", "SEARCH_K_MAX"]

SEARCH_K_MAX = 50  # the most drawers one search may ask for
EPISODES_K_MAX = 20  # the most episodes one search may add (include_episodes)
IDENTIFIER_MAX = 256  # the longest event, session, user or agent id an event may carry (and a forget name)
KG_FACTS_MAX = 1000  # the most facts one knowledge-graph query or timeline returns
