"""Row-invariant CPU kernels for the native path (build.py builds them, ops.py calls them)."""
