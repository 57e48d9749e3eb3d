"""The sample conversation ``palace demo`` publishes, and the questions it asks back."""

from __future__ import annotations

from typing import Any

DEMO_WORKSPACE = "demo"

DEMO_SESSIONS: list[dict[str, Any]] = [
    {
        "workspace_id": DEMO_WORKSPACE, "session_id": "kickoff-2026-11-02", "agent_id": "atlas",
        "user_id": "maria", "started_at": "2026-11-02T09:00:00Z", "completed_at": "2026-11-02T09:20:00Z",
        "metadata": {"wing": "project-orion"},
        "messages": [
            {"role": "user", "name": "Maria", "content": "Hi!"},
            {"role": "user", "name": "Maria", "content": "We decided to build Orion's backend on PostgreSQL with "
             "pgvector instead of running a separate vector database; one system to back up is worth it."},
            {"role": "assistant", "name": "Atlas", "content": "Noted: PostgreSQL + pgvector for Orion, no "
             "separate vector store. Should the embeddings be 384-dimensional to start?"},
            {"role": "user", "name": "Maria", "content": "Yes, 384 for now. I prefer small local models until "
             "we have real traffic; we can re-embed later."},
            {"role": "user", "name": "Maria", "content": "The staging deploy keeps failing with a timeout when "
             "the migrations run; the root cause seems to be a lock on the drawers table."},
            {"role": "user", "name": "Maria", "content": "Remind me to send the design review to Tomás by "
             "Friday."},
            {"role": "assistant", "name": "Atlas", "content": "Will do. Thanks!"},
        ],
    },
    {
        "workspace_id": DEMO_WORKSPACE, "session_id": "standup-2026-11-09", "agent_id": "atlas",
        "user_id": "maria", "started_at": "2026-11-09T09:00:00Z", "completed_at": "2026-11-09T09:10:00Z",
        "metadata": {"wing": "project-orion"},
        "messages": [
            {"role": "user", "name": "Maria", "content": "Good news: we finally fixed the staging deploy, the "
             "migration now takes the lock with a timeout and it works."},
            {"role": "user", "name": "Maria", "content": "I'm feeling much less stressed this week, the team "
             "morale is up after the launch."},
            {"role": "user", "name": "Maria", "content": "My daughter Emma starts school in Lisbon next "
             "September, so I'll work remotely from Portugal from August."},
            {"role": "assistant", "name": "Atlas", "content": "ok"},
        ],
    },
]

DEMO_QUESTIONS = [
    "Which database did we choose for Orion?",
    "Why did the staging deploy fail?",
    "What do I need to send to Tomás?",
    "Where will Maria work from next year?",
]
