"""Dead-letter headers quote the payload (field names, workspace ids), so they must survive any header
parser: nats-py's ``js.get_msg`` uses the e-mail parser, which turns non-ASCII values into ``Header``
objects, and that made ``palace dlq list`` fail on a letter whose reason named an unknown field 'ünï'."""

from email.parser import BytesParser

from shared.bus import _header_value, dead_letter_info

NASTY = "ünïcode field\r\nPalace-Service: forged\x00\ud800 end"


def test_header_values_are_printable_ascii_and_keep_the_information() -> None:
    v = _header_value(NASTY)
    assert v.isascii() and v.isprintable()
    assert v == "\\xfcn\\xefcode field\\r\\nPalace-Service: forged\\x00\\ud800 end"
    assert _header_value("plain reason: x") == "plain reason: x" and _header_value(3) == "3"


def test_dead_letter_info_reads_back_what_the_email_parser_returns() -> None:
    fields = {"subject": "session.completed", "service": "ingest", "reason": NASTY, "error_type": "invalid",
              "deliveries": 1, "failed_at": "2026-11-23T08:00:00Z", "size": 3}
    wire = "".join(f"Palace-{k}: {_header_value(v)}\r\n" for k, v in fields.items()).encode() + b"\r\n"
    parsed = dict(BytesParser().parsebytes(wire).items())
    info = dead_letter_info(parsed)
    assert info.service == "ingest" and "forged" in info.reason and info.reason.isascii()
    # Letters written before values were escaped: the parser's Header objects are still read as text.
    raw = BytesParser().parsebytes("Palace-reason: ünï\r\n\r\n".encode())
    assert isinstance(dead_letter_info({**parsed, "Palace-reason": raw["Palace-reason"]}).reason, str)
