"""The scripts under benchmarks/, run as a user runs them."""
