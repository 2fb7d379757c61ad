// Placeholder for the device sampler's kernels (issue 16).
