"""replay-order as data: which episodes (and input records) a training step saw."""
