"""What makes and judges optirack's results: the model's fingerprint and its probe set (more moves here)."""
