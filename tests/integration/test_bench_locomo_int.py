"""`palace bench locomo` end to end on a tiny LoCoMo-format file, against the test stack's servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.helpers import Stack

TINY = [{
    "sample_id": "tiny-1",
    "sessions": [
        {"session_id": "session_1", "date_time": "10:00 am on 1 June, 2023", "turns": [
            {"dia_id": "D1:1", "speaker": "Ann", "text": "I finally adopted a grey cat from the shelter last week."},
            {"dia_id": "D1:2", "speaker": "Bo", "text": "That's lovely! What did you name the cat?"},
            {"dia_id": "D1:3", "speaker": "Ann", "text": "Her name is Pixel, she loves sleeping on my keyboard."}]},
        {"session_id": "session_2", "date_time": "4:30 pm on 20 July, 2023", "turns": [
            {"dia_id": "D2:1", "speaker": "Bo", "text": "I signed up for a pottery class on Saturday mornings."},
            {"dia_id": "D2:2", "speaker": "Ann", "text": "Pottery sounds relaxing. I'm training for a half marathon."},
            {"dia_id": "D2:3", "speaker": "Bo", "text": "Good luck with the half marathon training in October!"}]},
    ],
    "questions": [
        {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:3"], "category": 4},
        {"question": "What class did Bo sign up for?", "answer": "pottery", "evidence": ["D2:1"], "category": 4},
        {"question": "What is Ann training for and where did her cat come from?",
         "answer": "a half marathon; a shelter", "evidence": ["D2:2", "D1:1"], "category": 1},
    ],
}]


def test_bench_locomo_on_a_tiny_file(stack: Stack, tmp_path: Path) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(TINY))
    out = tmp_path / "out.json"
    env = {**os.environ, "PALACE_DATABASE_URL": stack.database_url, "PALACE_NATS_URL": stack.nats_url}
    per_q = tmp_path / "questions.json"
    r = subprocess.run([sys.executable, "-m", "services.cli", "bench", "locomo", "--data", str(data),
                        "--json", str(out), "--questions", str(per_q)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LoCoMo retrieval" in r.stdout and "dense only" in r.stdout
    result = json.loads(out.read_text())
    assert set(result) == {"turn_recall@5", "turn_recall@10", "session_recall_any@5", "session_recall_any@10",
                           "questions", "search_p50_ms", "search_p95_ms", "per_category"}
    assert result["questions"] == 3
    assert result["turn_recall@10"] == 1.0  # six turns: every evidence turn is within the top 10
    assert result["session_recall_any@5"] == 1.0
    assert result["turn_recall@5"] >= 0.5
    assert set(result["per_category"]) == {"1", "4"}
    assert result["search_p50_ms"] > 0
    systems = json.loads(out.with_suffix(".systems.json").read_text())
    assert len(systems) == 4 and any(name.startswith("plain fusion") for name in systems)
    palace = next(v for name, v in systems.items() if name.startswith("Palace"))
    assert palace["query_embedding_p50_ms"] > 0
    assert isinstance(palace["graph_deadlines_hit"], int) and "graph lookups cut off" in r.stdout
    # Every question's ranked turns, so two runs can be compared question by question.
    rows = json.loads(per_q.read_text())
    assert [(q["sample_id"], q["qi"]) for q in rows] == [("tiny-1", 0), ("tiny-1", 1), ("tiny-1", 2)]
    assert rows[0]["evidence"] == ["D1:3"] and "D1:3" in rows[0]["ranked"][:10]
    assert all(len(h) == 2 and isinstance(h[1], float) for q in rows for h in q["hits"])
