"""Key-value stores behind the cached dataset, and the format of what they hold."""
