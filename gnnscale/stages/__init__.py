"""Pipeline stages: each exposes run(cfg) -> dict and talks to others only through files."""
