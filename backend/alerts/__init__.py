"""Alerts of a run: the rules raised at metric ingest (service.py) and their rows (models.py)."""
