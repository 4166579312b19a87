"""Presentation: the Report rendered for a terminal, as HTML and as a PNG."""
