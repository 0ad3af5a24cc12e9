"""Noise stage: perturbation operators, overlay databases, pair verification, benchmark export."""
