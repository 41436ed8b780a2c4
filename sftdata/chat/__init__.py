"""Chat rendering with sftdata's markers or a model's template, and the mask rule either yields."""
