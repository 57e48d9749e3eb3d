"""Retrieval evaluation: LoCoMo data handling and metrics (pure functions)."""
