"""The receiving end of `fab pull` on the host (shipped: standard library only, Python 3.9+)."""
