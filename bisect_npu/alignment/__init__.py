"""Precision alignment without bisecting: records (a reference run kept with where it ran) and the
stage-by-stage comparison of two of them."""
