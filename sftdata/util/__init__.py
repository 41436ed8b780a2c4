"""Helpers every layer may use: ranges of arrays, memory checks, hashing, OS errors that name their path, URLs, the
cache folder, worker lifetime, a progress bar drawn from its first report."""
