"""The single source of the distribution's version (read by hatch and by both packages)."""

__version__ = "0.1.0"
