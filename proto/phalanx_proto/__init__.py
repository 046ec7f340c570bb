"""Phalanx's wire contract: every message that crosses NATS JetStream, as msgspec Structs.

Services and libraries share these types and nothing else. Rules (docs/events.md):
tags never change, new fields only with defaults, a field's type never changes, unknown
fields are accepted on decode.
"""
