"""Helpers every layer may use: ranges of arrays, memory checks, hashing, URLs, the cache folder, worker lifetime."""
