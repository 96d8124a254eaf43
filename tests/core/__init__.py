"""Engine, communicators, store, kernels, process groups, settings, launcher, autotune and trace,
the device path, and the algorithms across both frameworks."""
