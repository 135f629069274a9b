"""Paper reproductions, one folder per paper; ``python -m reproductions`` regenerates figures/."""
