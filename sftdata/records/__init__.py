"""Input records read as conversations: turns, content parts, media, tool formats, exact JSON."""
