"""Bagua 0.9.2's console scripts (``baguarun``)."""
