"""Input records read as conversations: turns, content parts, tool formats, exact JSON."""
