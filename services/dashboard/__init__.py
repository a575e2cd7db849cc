"""`rlrun dashboard`: a read-only web page over run folders (docs/dashboard.md)."""
