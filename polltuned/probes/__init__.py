"""Latency sources. Each probe turns one measurement window into a :class:`polltuned.records.Window`."""
