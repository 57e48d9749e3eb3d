"""The README's producer reference (fields, roles, limits, dead-letter headers) is generated from the
event models and settings; it fails here, and in `palace schemas --check`, the moment they drift."""

from pathlib import Path

from shared.config import Settings
from shared.events import DeadLetterInfo, Message
from shared.events.export import README_BEGIN, README_END, readme_with_reference, render_producer_reference

README = Path(__file__).resolve().parents[2] / "docs" / "integrate.md"


def test_readme_reference_is_current() -> None:
    text = README.read_text()
    assert README_BEGIN in text and README_END in text
    assert readme_with_reference(text) == text, "run 'palace schemas' to regenerate the README reference"


def test_reference_says_what_a_producer_needs() -> None:
    ref = render_producer_reference()
    for role in Message.model_fields["role"].annotation.__args__:  # type: ignore[union-attr]
        assert f"`{role}`" in ref
    for name in ("workspace_id", "session_id", "messages", "event_id", "content", "created_at"):
        assert f"| `{name}` |" in ref
    assert "| `workspace_id` | yes |" in ref and "| `event_id` | no |" in ref
    defaults = Settings.model_fields
    assert f"{defaults['max_event_bytes'].default:,} bytes" in ref
    assert f"{defaults['max_messages_per_session'].default:,} messages" in ref
    for field in DeadLetterInfo.model_fields:
        assert field == "stream_seq" or f"`Palace-{field}`" in ref
