"""Templates of the scripts kit generates (installed as the package kit.templates)."""
